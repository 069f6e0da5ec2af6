//! A partition's tag filters from untrusted bytes (they travel through meta):
//! parse or error, never panic; a parsed filter answers lookups and
//! serializes back to bytes that parse again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sealion_format::sealed::TagFilters;

fuzz_target!(|data: &[u8]| {
    let Ok(filters) = TagFilters::from_bytes(data) else { return };
    let tags: Vec<String> = filters.tags().map(str::to_string).collect();
    for tag in &tags {
        let _ = filters.may_contain(tag, "host_0");
    }
    TagFilters::from_bytes(&filters.to_bytes()).expect("re-serialized filters parse");
});
