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

/// Bytes of the values a batch holds (its rows' slices of each buffer),
/// what shipping it costs: not the capacity its builders reserved, which
/// for a batch of a few rows is many times more.
pub fn batch_bytes(batch: &arrow::record_batch::RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size()) as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Builder, StringBuilder};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    #[test]
    fn batch_bytes_counts_the_rows_not_the_reserved_capacity() {
        let mut s = StringBuilder::with_capacity(8192, 8192 * 16);
        let mut f = Float64Builder::with_capacity(8192);
        s.append_value("host_01");
        f.append_value(1.5);
        let schema = Arc::new(Schema::new(vec![
            Field::new("h", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(s.finish()), Arc::new(f.finish())]).unwrap();
        let bytes = super::batch_bytes(&batch);
        // Two offsets and seven bytes of text, one float (no nulls).
        assert_eq!(bytes, 8 + 7 + 8);
        assert!(batch.get_array_memory_size() as u64 > 100 * bytes);
    }
}
