//! Answers as Arrow IPC streams (`format=arrow`), with the schema message of
//! a small answer taken from the ones encoded before.
//!
//! A stream is the schema message, then each batch's message, then the
//! end-of-stream marker. For a one-row answer of 21 columns, encoding the
//! schema message (a flatbuffer of every field) was a tenth of the whole
//! query's instructions, and a dashboard asks the same query, with the
//! same schema, again and again. So the schema messages of answers are kept
//! (`MAX_SCHEMAS`, the answer's `Schema` beside its bytes) and a small
//! answer's stream starts with the kept bytes; its batches are encoded as
//! `StreamWriter` encodes them. A large answer, where the schema is a small
//! part of the work, and a schema with dictionaries (whose messages depend
//! on the batches) are written by `StreamWriter` itself. Either way the
//! bytes are those `StreamWriter` writes (tested below).

use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions, StreamWriter,
    write_message,
};
use arrow::record_batch::RecordBatch;

/// Schema messages kept at most; a full set is emptied before the next one
/// goes in.
pub const MAX_SCHEMAS: usize = 64;
/// Answers whose rows hold more than this many bytes (`batch_bytes`) are
/// written by `StreamWriter` alone.
pub const MAX_SMALL_ANSWER_BYTES: usize = 64 * 1024;
/// The end of a stream (IPC metadata version 5, the default): the
/// continuation marker and a zero length.
const END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

#[derive(Default)]
pub struct SchemaMessages {
    kept: Mutex<Vec<(SchemaRef, Arc<[u8]>)>>,
}

impl SchemaMessages {
    /// `batches` (of `schema`) as one Arrow IPC stream.
    pub fn stream(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<Vec<u8>, ArrowError> {
        // The rows' bytes, not the capacity under them: an answer cut from
        // a larger batch (a LIMIT) is as small as its rows.
        let bytes = batches.iter().map(sealion_format::batch_bytes).sum::<u64>() as usize;
        if bytes > MAX_SMALL_ANSWER_BYTES || has_dictionary(schema) {
            return plain_stream(schema, batches);
        }
        let head = self.schema_message(schema)?;
        let mut out = Vec::with_capacity(head.len() + bytes + 1024);
        out.extend_from_slice(&head);
        let options = IpcWriteOptions::default();
        let generator = IpcDataGenerator::default();
        let mut dictionaries = DictionaryTracker::new(false);
        let mut context = IpcWriteContext::default();
        for batch in batches {
            let (_no_dictionaries, message) =
                generator.encode(batch, &mut dictionaries, &options, &mut context)?;
            write_message(&mut out, message, &options)?;
        }
        out.extend_from_slice(&END_OF_STREAM);
        Ok(out)
    }

    /// How many schema messages are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The encoded schema message of `schema`: a kept one (the same `Arc`,
    /// or an equal schema) or a new one, then kept.
    fn schema_message(&self, schema: &SchemaRef) -> Result<Arc<[u8]>, ArrowError> {
        {
            let kept = self.lock();
            let found = kept
                .iter()
                .find(|(s, _)| Arc::ptr_eq(s, schema))
                .or_else(|| kept.iter().find(|(s, _)| **s == **schema));
            if let Some((_, message)) = found {
                metrics::counter!("sealion_query_schema_messages_reused_total").increment(1);
                return Ok(Arc::clone(message));
            }
        }
        // A stream writer writes the schema message when it is made, and
        // nothing when it is dropped unfinished.
        let mut message = Vec::new();
        StreamWriter::try_new(&mut message, schema)?;
        let message: Arc<[u8]> = message.into();
        let mut kept = self.lock();
        if kept.len() >= MAX_SCHEMAS {
            kept.clear();
        }
        kept.push((Arc::clone(schema), Arc::clone(&message)));
        Ok(message)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(SchemaRef, Arc<[u8]>)>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `batches` as `StreamWriter` writes them.
pub fn plain_stream(schema: &Schema, batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, schema)?;
    for batch in batches {
        w.write(batch)?;
    }
    w.finish()?;
    drop(w);
    Ok(out)
}

fn has_dictionary(schema: &Schema) -> bool {
    fn nested(t: &DataType) -> bool {
        match t {
            DataType::Dictionary(_, _) => true,
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::ListView(f)
            | DataType::LargeListView(f)
            | DataType::FixedSizeList(f, _)
            | DataType::Map(f, _) => nested(f.data_type()),
            DataType::Struct(fields) => fields.iter().any(|f| nested(f.data_type())),
            DataType::Union(fields, _) => fields.iter().any(|(_, f)| nested(f.data_type())),
            DataType::RunEndEncoded(a, b) => nested(a.data_type()) || nested(b.data_type()),
            _ => false,
        }
    }
    schema.fields().iter().any(|f| nested(f.data_type()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        ArrayRef, BooleanArray, DictionaryArray, Float64Array, Int64Array, StringArray,
        TimestampNanosecondArray, UInt64Array,
    };
    use arrow::datatypes::{Field, Int32Type, TimeUnit};

    fn answer(rows: usize, tag: &str) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "time",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new(tag, DataType::Utf8, true),
            Field::new("usage", DataType::Float64, true),
            Field::new("n", DataType::Int64, true),
            Field::new("u", DataType::UInt64, true),
            Field::new("ok", DataType::Boolean, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampNanosecondArray::from_iter_values((0..rows as i64).map(|i| i * 10))
                    .with_timezone("UTC"),
            ),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then(|| format!("host_{i}"))),
            )),
            Arc::new(Float64Array::from_iter(
                (0..rows).map(|i| (i % 4 != 0).then_some(i as f64 / 3.0)),
            )),
            Arc::new(Int64Array::from_iter((0..rows).map(|i| Some(i as i64 - 5)))),
            Arc::new(UInt64Array::from_iter(
                (0..rows).map(|i| (i % 2 == 0).then_some(i as u64)),
            )),
            Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(i % 5 == 0)))),
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    fn read_back(bytes: &[u8]) -> Vec<RecordBatch> {
        arrow::ipc::reader::StreamReader::try_new(bytes, None)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn streams_are_the_bytes_stream_writer_writes_from_a_kept_schema_or_not() {
        let messages = SchemaMessages::default();
        let one = answer(1, "host");
        let schema = one.schema();
        let cases: Vec<(SchemaRef, Vec<RecordBatch>)> = vec![
            (schema.clone(), vec![one.clone()]),
            (schema.clone(), vec![]),
            (
                schema.clone(),
                vec![answer(7, "host"), answer(0, "host"), answer(3, "host")],
            ),
            // Large: written by StreamWriter alone.
            (schema.clone(), vec![answer(20_000, "host")]),
            // Another schema (equal but for a name).
            (answer(2, "hostname").schema(), vec![answer(2, "hostname")]),
        ];
        for round in 0..2 {
            for (schema, batches) in &cases {
                let got = messages.stream(schema, batches).unwrap();
                let want = plain_stream(schema, batches).unwrap();
                assert!(
                    got == want,
                    "round {round}: {} batches differ",
                    batches.len()
                );
                assert_eq!(read_back(&got), *batches);
            }
        }
        // One message per schema, found again by an equal schema in another
        // `Arc` too.
        assert_eq!(messages.len(), 2);
        let copy = Arc::new((*schema).clone());
        let got = messages.stream(&copy, std::slice::from_ref(&one)).unwrap();
        assert!(got == plain_stream(&copy, &[one]).unwrap());
        assert_eq!(messages.len(), 2);
    }

    #[test]
    fn dictionaries_go_through_the_stream_writer_and_a_full_set_starts_over() {
        let messages = SchemaMessages::default();
        let keys: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([("d", Arc::new(keys) as ArrayRef)]).unwrap();
        let got = messages
            .stream(&batch.schema(), std::slice::from_ref(&batch))
            .unwrap();
        assert!(got == plain_stream(&batch.schema(), std::slice::from_ref(&batch)).unwrap());
        assert_eq!(read_back(&got), vec![batch]);
        assert!(messages.is_empty());
        for i in 0..MAX_SCHEMAS {
            let b = answer(1, &format!("tag{i}"));
            messages.stream(&b.schema(), &[b]).unwrap();
        }
        assert_eq!(messages.len(), MAX_SCHEMAS);
        let b = answer(1, "one more");
        messages.stream(&b.schema(), &[b]).unwrap();
        assert_eq!(messages.len(), 1);
    }
}
