//! A partial aggregate state from untrusted bytes (what a storage node sends
//! a query node): decode or error, never panic; a decoded state re-encodes to
//! bytes that decode to the same encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sealion_partial::State;

fuzz_target!(|data: &[u8]| {
    let Ok(state) = State::decode(data) else { return };
    let bytes = state.encode();
    let again = State::decode(&bytes).expect("a re-encoded state decodes");
    assert_eq!(again.encode(), bytes);
});
