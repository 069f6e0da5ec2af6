//! The storage engine of the open partitions: one RocksDB instance per node.
//!
//! Every call here blocks on disk; async callers run them on the blocking
//! pool. A write returns only after RocksDB has synced its WAL, so an
//! acknowledged write survives a crash of the process or the machine.

use std::path::Path;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use rocksdb::{DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions};
use sealion_common::proto::{Column, ScanRequest};

use crate::rows::{BatchBuilder, decode_key, encode_batch, partition_prefix};
use crate::{Error, Result};

/// Rows per Arrow batch that a scan emits.
pub const SCAN_BATCH_ROWS: usize = 8_192;

#[derive(Clone)]
pub struct Engine {
    db: Arc<DB>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub rows: u64,
    pub bytes: u64,
}

impl Engine {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.set_bottommost_compression_type(rocksdb::DBCompressionType::Zstd);
        let db = DB::open(&opts, path)?;
        Ok(Engine { db: Arc::new(db) })
    }

    /// Stores all rows of all `parts` in one atomic, synced RocksDB batch:
    /// either every row of the request is durable or none is.
    pub fn write(&self, columns: &[Column], parts: &[(u64, Vec<RecordBatch>)]) -> Result<u64> {
        let mut batch = WriteBatch::default();
        let mut rows = 0u64;
        for (partition_id, batches) in parts {
            for b in batches {
                for (k, v) in encode_batch(*partition_id, columns, b)? {
                    batch.put(k, v);
                    rows += 1;
                }
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(rows)
    }

    fn partition_iter(&self, partition_id: u64) -> rocksdb::DBIterator<'_> {
        let prefix = partition_prefix(partition_id);
        let mut ro = ReadOptions::default();
        match partition_id.checked_add(1) {
            Some(next) => ro.set_iterate_upper_bound(partition_prefix(next).to_vec()),
            None => {}
        }
        self.db
            .iterator_opt(IteratorMode::From(&prefix, Direction::Forward), ro)
    }

    /// Runs `req` and hands each batch of at most `SCAN_BATCH_ROWS` rows to
    /// `emit`; stops early when `emit` returns false or the limit is reached.
    pub fn scan(&self, req: &ScanRequest, mut emit: impl FnMut(RecordBatch) -> bool) -> Result<()> {
        // An empty projection asks for row counts only (`count(*)`).
        let projection: Vec<Column> = req.projection.clone();
        let limit = if req.limit == 0 { u64::MAX } else { req.limit };
        let mut builder = BatchBuilder::new(projection);
        let mut emitted = 0u64;
        for &pid in &req.partition_ids {
            for item in self.partition_iter(pid) {
                let (key, value) = item?;
                let (kpid, series, t) = decode_key(&key).ok_or_else(|| Error::Corrupt {
                    partition_id: pid,
                    reason: "bad key".into(),
                })?;
                if kpid != pid {
                    break;
                }
                if t < req.start_ns || t >= req.end_ns {
                    continue;
                }
                builder.push(pid, series, t, &value)?;
                emitted += 1;
                if builder.rows() >= SCAN_BATCH_ROWS && !emit(builder.finish()?) {
                    return Ok(());
                }
                if emitted >= limit {
                    break;
                }
            }
            if emitted >= limit {
                break;
            }
        }
        if builder.rows() > 0 {
            emit(builder.finish()?);
        }
        Ok(())
    }

    /// Rows and bytes (keys plus values, uncompressed) of a partition.
    pub fn stats(&self, partition_id: u64) -> Result<Stats> {
        let mut stats = Stats::default();
        for item in self.partition_iter(partition_id) {
            let (key, value) = item?;
            stats.rows += 1;
            stats.bytes += (key.len() + value.len()) as u64;
        }
        Ok(stats)
    }

    /// Ids of the partitions this node holds rows of, in order. Seeks from
    /// one partition's prefix to the next, so it costs one seek per
    /// partition, not one step per row.
    pub fn partition_ids(&self) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        let mut next: Option<u64> = Some(0);
        while let Some(from) = next {
            let prefix = partition_prefix(from);
            let mut it = self.db.iterator(IteratorMode::From(&prefix, Direction::Forward));
            let Some(item) = it.next() else { break };
            let (key, _) = item?;
            let Some((pid, _, _)) = decode_key(&key) else {
                return Err(Error::Corrupt {
                    partition_id: from,
                    reason: "bad key while listing partitions".into(),
                });
            };
            ids.push(pid);
            next = pid.checked_add(1);
        }
        Ok(ids)
    }

    /// Deletes every row of the given partitions (synced).
    pub fn drop_partitions(&self, partition_ids: &[u64]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for &pid in partition_ids {
            let from = partition_prefix(pid).to_vec();
            let to = match pid.checked_add(1) {
                Some(next) => partition_prefix(next).to_vec(),
                None => vec![0xff; 9],
            };
            batch.delete_range(from, to);
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, StringArray, TimestampNanosecondArray};
    use sealion_common::proto::{ColumnKind, DataType};

    fn columns() -> Vec<Column> {
        let c = |n: &str, k: ColumnKind, t: DataType| Column {
            name: n.into(),
            kind: k as i32,
            data_type: t as i32,
        };
        vec![
            c("time", ColumnKind::Time, DataType::Timestamp),
            c("host", ColumnKind::Tag, DataType::String),
            c("v", ColumnKind::Field, DataType::Float64),
        ]
    }

    fn batch(rows: &[(&str, i64, f64)]) -> RecordBatch {
        RecordBatch::try_new(
            sealion_common::catalog::arrow_schema(&columns()),
            vec![
                Arc::new(TimestampNanosecondArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>()).with_timezone("UTC")),
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn partitions_are_listed_and_dropped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(e.partition_ids().unwrap(), Vec::<u64>::new());
        let cols = columns();
        e.write(&cols, &[(3, vec![batch(&[("a", 1, 1.0), ("b", 2, 2.0)])]), (7, vec![batch(&[("a", 5, 3.0)])])])
            .unwrap();
        e.write(&cols, &[(u64::MAX, vec![batch(&[("z", 9, 9.0)])])]).unwrap();
        assert_eq!(e.partition_ids().unwrap(), vec![3, 7, u64::MAX]);
        assert_eq!(e.stats(3).unwrap().rows, 2);
        e.drop_partitions(&[3, u64::MAX]).unwrap();
        assert_eq!(e.partition_ids().unwrap(), vec![7]);
        assert_eq!(e.stats(3).unwrap().rows, 0);
        assert_eq!(e.stats(7).unwrap().rows, 1);
    }
}
