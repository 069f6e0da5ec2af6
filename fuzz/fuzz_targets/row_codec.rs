//! The open partition's row key, series key and value decoders on untrusted
//! bytes (what RocksDB hands back after a disk fault): `None` or a value,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sealion_format::rows::{decode_fields, decode_key, decode_series};

fuzz_target!(|data: &[u8]| {
    if let Some((_, series, _)) = decode_key(data) {
        let _ = decode_series(series);
    }
    let _ = decode_series(data);
    let _ = decode_fields(data);
});
