//! openraft's own conformance suite over the RocksDB log store and state
//! machine.

use openraft::testing::{StoreBuilder, Suite};
use sealion_meta::store::{LogStore, StateMachine, open_db};
use sealion_meta::types::{StorageError, TypeConfig};
use tempfile::TempDir;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().unwrap();
        let (db, _closed) = open_db(dir.path()).unwrap();
        let (sm, _published) = StateMachine::open(db.clone()).await.unwrap();
        Ok((dir, LogStore::new(db), sm))
    }
}

#[test]
fn rocksdb_store_passes_openraft_suite() {
    Suite::test_all(RocksBuilder).unwrap();
}
