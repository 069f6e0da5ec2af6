//! A single replica keeps everything across restarts: from the log alone,
//! and from a snapshot plus the entries committed after it.

use std::time::Duration;

use sealion_common::meta_client::MetaClient;
use sealion_common::time::DEFAULT_PARTITION_INTERVAL_NS;
use sealion_proto::meta_command::Cmd;
use sealion_proto::{
    AddColumns, ColumnKind, CreateDatabase, DataType, EnsurePartitions, RegisterNode,
};

use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_replica_keeps_tables_nodes_and_partitions_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(1, any_port(), dir.path());
    cfg.bootstrap = true;
    let server = start(cfg.clone()).await;
    let addr = server.local_addr();
    cfg.listen_addr = addr;

    let client = MetaClient::connect(&[addr.to_string()], Duration::from_secs(10))
        .await
        .unwrap();

    // No storage node yet: placing a partition is refused as unavailable.
    let table = client
        .propose(create_table("public", "cpu"))
        .await
        .unwrap()
        .table
        .unwrap();
    let day = DEFAULT_PARTITION_INTERVAL_NS;
    let refused = client
        .propose(Cmd::EnsurePartitions(EnsurePartitions {
            table_id: table.id,
            starts_ns: vec![0],
            placements: vec![],
        }))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, sealion_common::Error::Rejected { kind, .. } if kind == "unavailable"),
        "{refused:?}"
    );

    let node = client
        .propose(Cmd::RegisterNode(RegisterNode {
            id: 0,
            addr: "127.0.0.1:9100".into(),
            now_ms: 1,
        }))
        .await
        .unwrap()
        .node
        .unwrap();
    let parts = client
        .propose(Cmd::EnsurePartitions(EnsurePartitions {
            table_id: table.id,
            starts_ns: vec![0, day],
            placements: vec![],
        }))
        .await
        .unwrap();
    assert_eq!(parts.partitions.len(), 2);
    assert!(parts.partitions.iter().all(|p| p.replicas == vec![node.id]));

    // Snapshot now, then change more: the restart must combine both.
    server.raft().trigger().snapshot().await.unwrap();
    let snap_index = parts.version;
    eventually("a snapshot", Duration::from_secs(10), || async {
        let m = server.raft().metrics().borrow().clone();
        m.snapshot.filter(|s| s.index >= snap_index).map(|_| ())
    })
    .await;
    client
        .propose(Cmd::CreateDatabase(CreateDatabase {
            name: "after_snapshot".into(),
            if_not_exists: false,
        }))
        .await
        .unwrap();
    client
        .propose(Cmd::AddColumns(AddColumns {
            database: "public".into(),
            table: "cpu".into(),
            columns: vec![col("idle", ColumnKind::Field, DataType::Float64)],
            ..Default::default()
        }))
        .await
        .unwrap();

    let before = client.get_state(true).await.unwrap().state.unwrap();
    drop(client);
    server.shutdown().await.unwrap();

    for round in 0..2 {
        let server = start(cfg.clone()).await;
        let after = eventually(
            "the restarted replica to apply its log",
            Duration::from_secs(10),
            || async {
                local_state(addr)
                    .await
                    .filter(|s| s.version >= before.version)
            },
        )
        .await;
        assert_eq!(content(&after), content(&before), "round {round}");
        assert!(after.databases.iter().any(|d| d.name == "after_snapshot"));
        assert_eq!(after.tables[0].schema_version, 2);
        // Still accepts changes after the restart.
        let client = MetaClient::connect(&[addr.to_string()], Duration::from_secs(10))
            .await
            .unwrap();
        let again = client
            .propose(Cmd::RegisterNode(RegisterNode {
                id: 0,
                addr: "127.0.0.1:9100".into(),
                now_ms: 2,
            }))
            .await
            .unwrap();
        assert_eq!(
            again.node.unwrap().id,
            node.id,
            "re-registration is idempotent"
        );
        drop(client);
        server.shutdown().await.unwrap();
    }
}
