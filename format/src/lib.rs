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
        .map(|c| slice_bytes(c.as_ref()).unwrap_or_else(|| slice_bytes_of_data(c.as_ref())) as u64)
        .sum()
}

/// What `ArrayData::get_slice_memory_size` gives, for the types scans
/// answer with (fixed-width, boolean, `Utf8`, `Binary`), worked out from
/// the array itself: going through `to_data` copies every buffer handle
/// first, which for a one-row answer of 21 columns was 5% of the query.
/// None for other types.
fn slice_bytes(c: &dyn arrow::array::Array) -> Option<usize> {
    use arrow::array::AsArray;
    use arrow::datatypes::DataType;
    let n = c.len();
    // (`ArrayData` drops a null buffer that holds no null.)
    let nulls = if c.null_count() > 0 { n.div_ceil(8) } else { 0 };
    let text = |offsets: &[i32]| (n + 1) * 4 + (offsets[n] - offsets[0]) as usize;
    let body = match c.data_type() {
        DataType::Boolean => n.div_ceil(8),
        DataType::Utf8 => text(c.as_string::<i32>().value_offsets()),
        DataType::Binary => text(c.as_binary::<i32>().value_offsets()),
        t if t.is_primitive() => n * t.primitive_width()?,
        _ => return None,
    };
    Some(body + nulls)
}

fn slice_bytes_of_data(c: &dyn arrow::array::Array) -> usize {
    c.to_data()
        .get_slice_memory_size()
        .unwrap_or_else(|_| c.get_array_memory_size())
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

    /// The direct count equals `ArrayData::get_slice_memory_size` (the
    /// model) for every type it handles, with and without nulls, whole
    /// and sliced.
    #[test]
    fn slice_bytes_equal_array_data_s_count() {
        use arrow::array::{
            Array, ArrayRef, BinaryArray, BooleanArray, Float64Array, Int64Array, ListArray,
            StringArray, TimestampNanosecondArray, UInt8Array, UInt64Array,
        };
        use arrow::datatypes::Int64Type;
        let n = 37usize;
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(Float64Array::from_iter(
                (0..n).map(|i| (i % 3 != 0).then_some(i as f64)),
            )),
            Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64))),
            Arc::new(Int64Array::from_iter(
                (0..n).map(|i| (i % 5 != 1).then_some(i as i64)),
            )),
            Arc::new(UInt64Array::from_iter_values(0..n as u64)),
            Arc::new(UInt8Array::from_iter_values((0..n).map(|i| i as u8))),
            Arc::new(
                TimestampNanosecondArray::from_iter_values((0..n).map(|i| i as i64 * 10))
                    .with_timezone("UTC"),
            ),
            Arc::new(BooleanArray::from_iter(
                (0..n).map(|i| (i % 4 != 0).then_some(i % 2 == 0)),
            )),
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| (i % 6 != 0).then(|| "x".repeat(i % 9))),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("host_{i}")),
            )),
            Arc::new(BinaryArray::from_iter(
                (0..n).map(|i| (i % 2 == 0).then(|| vec![i as u8; i % 4])),
            )),
        ];
        for a in &arrays {
            for (offset, len) in [(0, n), (0, 0), (5, 11), (n - 1, 1), (3, n - 3)] {
                let s = a.slice(offset, len);
                let want = s.to_data().get_slice_memory_size().unwrap();
                assert_eq!(
                    super::slice_bytes(s.as_ref()),
                    Some(want),
                    "{:?} {offset}+{len}",
                    s.data_type()
                );
            }
        }
        // Other types take the model's path.
        let list =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), None])]);
        assert_eq!(super::slice_bytes(&list), None);
        let batch = RecordBatch::try_from_iter([("l", Arc::new(list) as ArrayRef)]).unwrap();
        assert_eq!(
            super::batch_bytes(&batch),
            batch.column(0).to_data().get_slice_memory_size().unwrap() as u64
        );
    }
}
