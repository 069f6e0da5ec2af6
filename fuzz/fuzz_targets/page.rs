//! A column page from untrusted bytes: decoding must return a page or an
//! error, never panic, and a page it returns must re-encode and decode to the
//! same values. (Checksums are not checked in fuzz builds, so the bytes reach
//! every codec.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use sealion_format::columnar::{EncodeOptions, MAX_PAGE_VALUES, decode_page, encode_page};

fuzz_target!(|data: &[u8]| {
    let Ok(page) = decode_page(data) else { return };
    assert!(page.len() <= MAX_PAGE_VALUES);
    let again = encode_page(&page, &EncodeOptions::default()).expect("a decoded page re-encodes");
    let back = decode_page(&again).expect("a re-encoded page decodes");
    assert_eq!(back.len(), page.len());
    assert_eq!(format!("{:?}", back.values), format!("{:?}", page.values));
});
