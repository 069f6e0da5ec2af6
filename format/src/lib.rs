//! Sealion's data formats, kept apart from the storage node so that they can
//! be fuzzed, benchmarked and read without RocksDB or a network:
//!
//! - [`rows`]: the open partition's row codec (RocksDB keys and values) and
//!   the Arrow batch builder that both scans share;
//! - [`columnar`]: the page codecs (delta-of-delta, frame of reference,
//!   Gorilla, dictionary, runs, bitmaps) with their CRC32C framing;
//! - [`sealed`]: the sealed partition file and its directory;
//! - [`digest`]: a digest of a partition's rows that replicas compare.
//!
//! Every decoder here takes untrusted bytes: a corrupt input is an error that
//! names what was wrong, never a panic and never a wrong value.

pub mod columnar;
pub mod digest;
pub mod error;
pub mod rows;
pub mod scan;
pub mod sealed;

pub use error::{Error, Result};

/// Whether a stored checksum matches the computed one. Fuzz builds (cargo
/// fuzz sets `cfg(fuzzing)`) accept any checksum, so that the fuzzer's bytes
/// reach the decoders behind it instead of stopping at the first CRC.
#[inline]
pub(crate) fn checksum_ok(stored: u32, computed: u32) -> bool {
    stored == computed || cfg!(fuzzing)
}

/// Rows per Arrow batch that a scan hands on, open or sealed.
pub const SCAN_BATCH_ROWS: usize = 8_192;
