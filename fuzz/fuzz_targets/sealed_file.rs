//! A sealed partition file from untrusted bytes: opening it and reading every
//! row must return rows or an error, never panic or run away with memory.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use sealion_format::sealed::SealedFile;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("sealion-fuzz-{}.slf", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else { return };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    if let Ok(file) = SealedFile::open(&path) {
        let mut n = 0u64;
        for row in file.rows() {
            if row.is_err() {
                break;
            }
            n += 1;
        }
        assert!(n <= file.summary().rows);
    }
    let _ = std::fs::remove_file(&path);
});
