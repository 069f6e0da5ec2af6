//! A digest of a partition's rows that two replicas can compare.
//!
//! Replicas of a partition receive the same writes but may hold them in
//! different shapes: one sealed long ago with late rows beside the file,
//! another rebuilt from a resync and sealed in one go. The digest therefore
//! describes the rows, not the bytes: each row's series key, time and
//! non-null fields (by name, type and value bits, in any order) hash to one
//! 64-bit value, and the digest is the row count with the wrapping sum of
//! those hashes. The sum does not depend on the order rows are visited in,
//! so any read path over the same rows gives the same digest.
//!
//! It is a check against bugs and damage, not against an adversary: XXH64
//! and a sum are cheap, and two different row sets collide with odds near
//! 2^-64.

use std::hash::Hasher;

use twox_hash::XxHash64;

use sealion_common::proto::Column;

use crate::rows::for_each_field;
use crate::sealed::SortedRow;
use crate::{Error, Result};

const KEY_SEED: u64 = 0x5ea1_10d1_6e57_0001;
const FIELD_SEED: u64 = 0x5ea1_10d1_6e57_0002;
const ROW_SEED: u64 = 0x5ea1_10d1_6e57_0003;

/// Row count and the wrapping sum of the rows' hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowDigest {
    pub rows: u64,
    pub sum: u64,
}

impl RowDigest {
    /// Adds one row of a table whose columns are `columns` (which name the
    /// fields of a row stored by column index, so both row formats of the
    /// same fields hash alike). `partition_id` only names the partition in
    /// the error for a malformed row value.
    pub fn add(&mut self, partition_id: u64, columns: &[Column], row: &SortedRow) -> Result<()> {
        let mut key = XxHash64::with_seed(KEY_SEED);
        key.write(&(row.series.len() as u64).to_le_bytes());
        key.write(&row.series);
        key.write(&row.time_ns.to_le_bytes());
        let mut fields = 0u64;
        let ok = for_each_field(&row.value, columns, |name, ty, payload| {
            let mut h = XxHash64::with_seed(FIELD_SEED);
            h.write(&(name.len() as u64).to_le_bytes());
            h.write(name.as_bytes());
            h.write(&[ty]);
            h.write(payload);
            fields = fields.wrapping_add(h.finish());
        });
        if !ok {
            return Err(Error::Corrupt {
                partition_id,
                reason: format!(
                    "row value of series {:?} at {} cannot be read (or names a column \
                     this node does not know yet)",
                    String::from_utf8_lossy(&row.series),
                    row.time_ns
                ),
            });
        }
        let mut h = XxHash64::with_seed(ROW_SEED);
        h.write(&key.finish().to_le_bytes());
        h.write(&fields.to_le_bytes());
        self.rows += 1;
        self.sum = self.sum.wrapping_add(h.finish());
        Ok(())
    }

    /// The digest of `rows`, stopping at the first error.
    pub fn of(
        partition_id: u64,
        columns: &[Column],
        rows: impl IntoIterator<Item = Result<SortedRow>>,
    ) -> Result<Self> {
        let mut d = RowDigest::default();
        for row in rows {
            d.add(partition_id, columns, &row?)?;
        }
        Ok(d)
    }
}

impl std::fmt::Display for RowDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rows, digest {:016x}", self.rows, self.sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{Value, encode_series};
    use crate::sealed::value::{put_field, start_value};
    use sealion_common::proto::{ColumnKind, DataType};

    fn value(fields: &[(&str, Value)]) -> Vec<u8> {
        let mut out = Vec::new();
        start_value(&mut out);
        for (name, v) in fields {
            put_field(&mut out, name, v.into());
        }
        out
    }

    fn row(host: &str, t: i64, fields: &[(&str, Value)]) -> SortedRow {
        SortedRow {
            series: encode_series(&[("host", host)]).unwrap(),
            time_ns: t,
            value: value(fields),
        }
    }

    fn digest(rows: &[SortedRow]) -> RowDigest {
        RowDigest::of(1, &[], rows.iter().cloned().map(Ok)).unwrap()
    }

    #[test]
    fn the_digest_ignores_row_and_field_order_but_sees_every_value() {
        let a = row("a", 1, &[("u", Value::F64(1.5)), ("n", Value::I64(3))]);
        let a_swapped = row("a", 1, &[("n", Value::I64(3)), ("u", Value::F64(1.5))]);
        let b = row("b", 1, &[("u", Value::F64(2.0))]);
        let base = digest(&[a.clone(), b.clone()]);
        assert_eq!(base.rows, 2);
        assert_eq!(base, digest(&[b.clone(), a_swapped]));
        // Each kind of difference changes it.
        let changed = [
            vec![a.clone()],
            vec![a.clone(), row("b", 2, &[("u", Value::F64(2.0))])],
            vec![a.clone(), row("c", 1, &[("u", Value::F64(2.0))])],
            vec![a.clone(), row("b", 1, &[("u", Value::F64(2.5))])],
            vec![a.clone(), row("b", 1, &[("v", Value::F64(2.0))])],
            vec![a.clone(), row("b", 1, &[("u", Value::I64(2))])],
            vec![a.clone(), row("b", 1, &[("u", Value::F64(-0.0))])],
            vec![a.clone(), row("b", 1, &[])],
            vec![a.clone(), b.clone(), b.clone()],
        ];
        for c in changed {
            assert_ne!(base, digest(&c), "{c:?}");
        }
        // Fields moved between two rows of one series are a different set.
        let x = row("a", 1, &[("u", Value::F64(1.0))]);
        let y = row("a", 2, &[("v", Value::F64(2.0))]);
        let x2 = row("a", 1, &[("v", Value::F64(2.0))]);
        let y2 = row("a", 2, &[("u", Value::F64(1.0))]);
        assert_ne!(digest(&[x, y]), digest(&[x2, y2]));
        assert_eq!(digest(&[]), RowDigest::default());
    }

    #[test]
    fn a_malformed_row_value_is_an_error_naming_the_partition() {
        let mut bad = row("a", 1, &[("u", Value::Str("long".into()))]);
        bad.value.truncate(bad.value.len() - 2);
        let err = RowDigest::of(7, &[], [Ok(bad)]).unwrap_err().to_string();
        assert!(err.contains("partition 7"), "{err}");
    }

    fn column(name: &str, kind: ColumnKind, data_type: DataType) -> Column {
        Column {
            name: name.into(),
            kind: kind as i32,
            data_type: data_type as i32,
        }
    }

    #[test]
    fn a_row_stored_by_column_index_digests_as_the_same_row_stored_by_names() {
        use arrow::array::{Float64Array, Int64Array, StringArray, TimestampNanosecondArray};
        use std::sync::Arc;
        let columns = vec![
            column("time", ColumnKind::Time, DataType::Timestamp),
            column("host", ColumnKind::Tag, DataType::String),
            column("u", ColumnKind::Field, DataType::Float64),
            column("n", ColumnKind::Field, DataType::Int64),
        ];
        let batch = arrow::record_batch::RecordBatch::try_new(
            sealion_common::catalog::arrow_schema(&columns),
            vec![
                Arc::new(TimestampNanosecondArray::from(vec![1, 2]).with_timezone("UTC")),
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Float64Array::from(vec![Some(1.5), Some(2.0)])),
                Arc::new(Int64Array::from(vec![Some(3), None])),
            ],
        )
        .unwrap();
        let stored: Vec<SortedRow> = crate::rows::encode_batch(1, &columns, &batch)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                let (_, series, time_ns) = crate::rows::decode_key(&k).unwrap();
                SortedRow {
                    series: series.to_vec(),
                    time_ns,
                    value: v,
                }
            })
            .collect();
        assert_eq!(stored[0].value[0], crate::rows::ROW_FORMAT_V2);
        let by_names = [
            row("a", 1, &[("u", Value::F64(1.5)), ("n", Value::I64(3))]),
            row("b", 2, &[("u", Value::F64(2.0))]),
        ];
        let of = |rows: &[SortedRow], columns: &[Column]| {
            RowDigest::of(1, columns, rows.iter().cloned().map(Ok))
        };
        assert_eq!(
            of(&stored, &columns).unwrap(),
            of(&by_names, &columns).unwrap()
        );
        // A reader that does not know column `n` yet cannot name it: an
        // error, never a digest of other rows.
        let err = of(&stored, &columns[..3]).unwrap_err().to_string();
        assert!(err.contains("does not know"), "{err}");
    }
}
