//! The open partition's row key, series key and value decoders on untrusted
//! bytes (what RocksDB hands back after a disk fault): `None` or a value,
//! never a panic. Values are decoded against a small table, so that field
//! indexes (row format 2) both hit and miss its columns.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sealion_format::rows::{decode_fields, decode_key, decode_series, for_each_field};
use sealion_common::proto::{Column, ColumnKind, DataType};

fn column(name: &str, kind: ColumnKind, data_type: DataType) -> Column {
    Column {
        name: name.into(),
        kind: kind as i32,
        data_type: data_type as i32,
    }
}

fuzz_target!(|data: &[u8]| {
    let table = [
        column("time", ColumnKind::Time, DataType::Timestamp),
        column("host", ColumnKind::Tag, DataType::String),
        column("f", ColumnKind::Field, DataType::Float64),
        column("s", ColumnKind::Field, DataType::String),
    ];
    if let Some((_, series, _)) = decode_key(data) {
        let _ = decode_series(series);
    }
    let _ = decode_series(data);
    let _ = decode_fields(data, &table);
    let _ = for_each_field(data, &table, |_, _, _| {});
});
