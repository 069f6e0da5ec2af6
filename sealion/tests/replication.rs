//! Replication with RF 3 over real processes: one meta replica, three
//! storage nodes and one query node on loopback. Clients write unique rows
//! and keep each batch's outcome; storage nodes are killed with SIGKILL and
//! restarted; every acknowledged row must be read back exactly once, from
//! whichever replica is left.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

/// Start of the rows' time: three days before now, at midnight, so that the
/// rows fall in partitions that have ended (they can be sealed).
fn base_ns() -> i64 {
    midnight_days_ago_ns(3)
}

/// Rows `first..first+n` of table `w`: row i has tag k = c{i % 4}, value i,
/// and a time of its own spread over two days.
fn batch(first: u64, n: u64) -> String {
    batch_plus(first, n, 0)
}

/// As [`batch`], with `add` added to every value.
fn batch_plus(first: u64, n: u64, add: u64) -> String {
    let base = base_ns();
    (first..first + n)
        .map(|i| {
            let t = base + (i as i64 % 2) * 86_400_000_000_000 + (i as i64) * 1_000_000_000;
            format!("w,k=c{} v={}i {t}\n", i % 4, i + add)
        })
        .collect()
}

/// Writes a batch until it is acknowledged; returns how many attempts did
/// not end in an acknowledgement (their outcome was unknown).
async fn write_acked(http: &Http, body: &str, within: Duration) -> usize {
    let deadline = std::time::Instant::now() + within;
    let mut unknown = 0;
    loop {
        let (status, text) = http.write("public", body.to_string()).await;
        if status == 204 {
            return unknown;
        }
        assert!(
            status == 503 || status == 500,
            "a write fails as unavailable, not as bad input: {status} {text}"
        );
        unknown += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "a batch was not acknowledged within {within:?}: {status} {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (rows, sum of v) of table `w`, as the cluster answers now.
async fn count_and_sum(http: &Http) -> Option<(u64, u64)> {
    let (s, b) = http.sql("public", "SELECT count(*), sum(v) FROM w").await;
    if s != 200 {
        return None;
    }
    Some((b["rows"][0][0].as_u64()?, b["rows"][0][1].as_u64()?))
}

/// The model: rows `0..n` minus those the DELETE removed.
fn model(n: u64, deleted: &[u64]) -> (u64, u64) {
    let kept = (0..n).filter(|i| !deleted.contains(i));
    (kept.clone().count() as u64, kept.sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_node_failures_and_replicas_catch_up() {
    let mut c = ProcCluster::start(1, 3, 3, &[]).await;
    let http = c.http.clone();

    // Phase 1: every node up. Every batch is acknowledged at once.
    const BATCH: u64 = 40;
    let mut next = 0u64;
    for _ in 0..10 {
        let (status, body) = http.write("public", batch(next, BATCH)).await;
        assert_eq!(status, 204, "{body}");
        next += BATCH;
    }
    let placed = http
        .rows(
            "public",
            "SELECT count(DISTINCT partition_id), count(*), bool_and(in_sync), count(DISTINCT node_id) \
             FROM system.partitions WHERE table_name = 'w'",
        )
        .await;
    assert_eq!(
        placed[0][0].as_u64().unwrap(),
        2,
        "two days, two partitions"
    );
    assert_eq!(placed[0][1].as_u64().unwrap(), 6, "three replicas each");
    assert_eq!(placed[0][2], serde_json::json!(true));
    assert_eq!(placed[0][3].as_u64().unwrap(), 3);
    // Every replica holds every row.
    let per_replica = http
        .rows(
            "public",
            "SELECT partition_id, min(rows), max(rows), sum(rows) FROM system.partitions \
             WHERE table_name = 'w' GROUP BY partition_id",
        )
        .await;
    let mut total = 0;
    for r in &per_replica {
        assert_eq!(
            r[1], r[2],
            "the replicas of a partition agree: {per_replica:?}"
        );
        total += r[3].as_u64().unwrap();
    }
    assert_eq!(total, 3 * next, "each row on three replicas");

    // A DELETE goes to every replica too; then the partitions are sealed
    // (the primary has its backups seal their copies).
    let deleted: Vec<u64> = (0..next).filter(|i| i % 4 == 1).collect();
    let (status, body) = http.sql("public", "DELETE FROM w WHERE k = 'c1'").await;
    assert_eq!(status, 200, "{body}");
    let sealed = admin_seal(&http, "w").await;
    assert!(sealed.iter().all(|o| o == "sealed"), "{sealed:?}");
    assert_eq!(count_and_sum(&http).await, Some(model(next, &deleted)));

    // A batch with an id, then a newer write of the same row without one.
    // The batch's retry (after the failover below, on another primary) must
    // not bring the old value back.
    let once_t = base_ns() + 3_600_000_000_000;
    let (status, body) = http
        .write_batch(
            "public",
            format!("w,k=once v=1i {once_t}\n"),
            Some("batch-once"),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = http
        .write("public", format!("w,k=once v=2i {once_t}\n"))
        .await;
    assert_eq!(status, 204, "{body}");
    let too_long = "x".repeat(129);
    let (status, body) = http
        .write_batch(
            "public",
            format!("w,k=once v=3i {once_t}\n"),
            Some(&too_long),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("batch_id"), "{body}");

    // Phase 2: kill the primary of the first partition with SIGKILL while
    // writing. Writes to partitions it leads fail until meta promotes a
    // backup; writes where it is a backup go on without it.
    let victim_id = http
        .rows(
            "public",
            "SELECT node_id FROM system.partitions WHERE table_name = 'w' AND role = 'primary' ORDER BY start LIMIT 1",
        )
        .await[0][0]
        .as_u64()
        .unwrap();
    let vi = c.index_of(victim_id).await;
    c.storages[vi].kill();
    let mut unknown = 0;
    for _ in 0..10 {
        unknown += write_acked(&http, &batch(next, BATCH), Duration::from_secs(60)).await;
        next += BATCH;
    }
    eprintln!("attempts with an unknown outcome while node {victim_id} was down: {unknown}");
    // The retried batch is applied once: the promoted primary knows the id.
    let (status, body) = http
        .write_batch(
            "public",
            format!("w,k=once v=1i {once_t}\n"),
            Some("batch-once"),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let once = http
        .rows("public", "SELECT v FROM w WHERE k = 'once'")
        .await;
    assert_eq!(
        once,
        vec![vec![serde_json::json!(2)]],
        "the retry undid a newer write"
    );
    let (status, body) = http.sql("public", "DELETE FROM w WHERE k = 'once'").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(count_and_sum(&http).await, Some(model(next, &deleted)));
    let out = http
        .rows(
            "public",
            &format!(
                "SELECT count(*) FROM system.partitions WHERE table_name = 'w' AND node_id = {victim_id} AND in_sync"
            ),
        )
        .await;
    assert_eq!(
        out[0][0].as_u64().unwrap(),
        0,
        "the dead node left the in-sync set of every partition written meanwhile"
    );
    let primaries = http
        .rows(
            "public",
            &format!(
                "SELECT count(*) FROM system.partitions WHERE table_name = 'w' AND role = 'primary' AND node_id = {victim_id}"
            ),
        )
        .await;
    assert_eq!(
        primaries[0][0].as_u64().unwrap(),
        0,
        "a backup was promoted"
    );

    // Phase 3: the node comes back and catches up before it is in sync.
    c.storages[vi].restart();
    let caught_up = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let (s, b) = http
                .sql(
                    "public",
                    "SELECT bool_and(in_sync), count(*) FROM system.partitions WHERE table_name = 'w'",
                )
                .await;
            if s == 200 && b["rows"][0][0] == true && b["rows"][0][1] == 6 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    if caught_up.is_err() {
        c.dump();
        panic!("the restarted node did not return to the in-sync set");
    }
    for _ in 0..3 {
        write_acked(&http, &batch(next, BATCH), Duration::from_secs(30)).await;
        next += BATCH;
    }

    // Phase 4: kill the other two. The node that came back is now the only
    // one; once it is promoted it answers with every acknowledged row.
    for (i, s) in c.storages.iter_mut().enumerate() {
        if i != vi {
            s.kill();
        }
    }
    let want = model(next, &deleted);
    let answered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if count_and_sum(&http).await == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    if answered.is_err() {
        c.dump();
        panic!(
            "the recovered node alone did not answer {want:?}: {:?}",
            count_and_sum(&http).await
        );
    }
    // And it takes writes alone (its in-sync set is just itself).
    write_acked(&http, &batch(next, BATCH), Duration::from_secs(30)).await;
    next += BATCH;
    assert_eq!(count_and_sum(&http).await, Some(model(next, &deleted)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gone_for_good_is_replaced_from_the_survivors() {
    // Four nodes, three replicas per partition: each partition has a node
    // to move to when one of its replicas is gone for good.
    let mut c = ProcCluster::start(1, 4, 3, &["--replace-after-ms", "4000"]).await;
    let http = c.http.clone();
    let mut next = 0u64;
    for _ in 0..6 {
        let (status, body) = http.write("public", batch(next, 40)).await;
        assert_eq!(status, 204, "{body}");
        next += 40;
    }
    let sealed = admin_seal(&http, "w").await;
    assert!(sealed.iter().all(|o| o == "sealed"), "{sealed:?}");
    // A node that holds a replica of the first partition goes away.
    let holders: Vec<u64> = http
        .rows(
            "public",
            "SELECT node_id FROM system.partitions WHERE table_name = 'w' \
             AND start = (SELECT min(start) FROM system.partitions WHERE table_name = 'w') ORDER BY role DESC",
        )
        .await
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    assert_eq!(holders.len(), 3);
    let gone = holders[0];
    let gi = c.index_of(gone).await;
    c.storages[gi].kill();
    // Meta puts another node in its place, which copies the partition from
    // the primary and joins the in-sync set.
    let replaced = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let (s, b) = http
                .sql(
                    "public",
                    &format!(
                        "SELECT count(*) FILTER (WHERE node_id = {gone}), bool_and(in_sync), count(*) \
                         FROM system.partitions WHERE table_name = 'w'"
                    ),
                )
                .await;
            if s == 200 && b["rows"][0] == serde_json::json!([0, true, 6]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    if replaced.is_err() {
        c.dump();
        panic!("the gone node's replicas were not re-created elsewhere");
    }
    // The first partition now lives on the two old holders and a new node.
    // Kill the two old ones: the new copy alone answers every row.
    let now: Vec<u64> = http
        .rows(
            "public",
            "SELECT node_id FROM system.partitions WHERE table_name = 'w' \
             AND start = (SELECT min(start) FROM system.partitions WHERE table_name = 'w')",
        )
        .await
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    let newcomer = *now.iter().find(|n| !holders.contains(n)).unwrap();
    // The partitions were sealed with nothing beside their files, so the
    // newcomer got the files themselves (checked, then put in place).
    let log = c.storages[c.index_of(newcomer).await].log_text();
    assert!(
        log.contains("installed a sealed file copied from the primary"),
        "the sealed partition was not copied as a file:\n{log}"
    );
    for old in holders.iter().filter(|n| **n != gone) {
        let i = c.index_of(*old).await;
        c.storages[i].kill();
    }
    let first_day = base_ns();
    let want = model(next, &[]);
    let want_first: (u64, u64) = {
        let rows = (0..next).filter(|i| i % 2 == 0);
        (rows.clone().count() as u64, rows.sum())
    };
    let answered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (s, b) = http
                .sql(
                    "public",
                    &format!(
                        "SELECT count(*), sum(v) FROM w WHERE time < to_timestamp_nanos({})",
                        first_day + 86_400_000_000_000
                    ),
                )
                .await;
            if s == 200
                && b["rows"][0][0].as_u64() == Some(want_first.0)
                && b["rows"][0][1].as_u64() == Some(want_first.1)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    if answered.is_err() {
        c.dump();
        panic!(
            "node {newcomer} alone did not answer the first day ({want_first:?}); all: {want:?}"
        );
    }
}

/// Waits until every replica of table `w` is in sync and the replicas of
/// each partition report the same row count; the per-partition
/// (epoch, rows) then.
async fn settled(c: &ProcCluster, within: Duration) -> Vec<(u64, u64)> {
    let http = &c.http;
    let done = tokio::time::timeout(within, async {
        loop {
            let (s, b) = http
                .sql(
                    "public",
                    "SELECT partition_id, bool_and(in_sync), min(rows), max(rows), max(epoch) \
                     FROM system.partitions WHERE table_name = 'w' GROUP BY partition_id ORDER BY partition_id",
                )
                .await;
            if s == 200 {
                let rows = b["rows"].as_array().unwrap();
                if rows.iter().all(|r| r[1] == true && r[2] == r[3]) {
                    return rows
                        .iter()
                        .map(|r| (r[4].as_u64().unwrap(), r[2].as_u64().unwrap()))
                        .collect::<Vec<_>>();
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    match done {
        Ok(v) => v,
        Err(_) => {
            c.dump();
            panic!("the replicas did not settle in sync with equal rows");
        }
    }
}

/// Writers that rewrite the same rows with values of their own, at once:
/// the backups apply the writes in the primary's order, so at the seal
/// every replica holds what the primary holds and none leaves the in-sync
/// set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_of_the_same_rows_leave_every_replica_alike() {
    let c = ProcCluster::start(1, 3, 3, &[]).await;
    let http = c.http.clone();
    let (status, body) = http.write("public", batch(0, 40)).await;
    assert_eq!(status, 204, "{body}");
    let before = settled(&c, Duration::from_secs(30)).await;
    let mut tasks = Vec::new();
    for w in 1..=6u64 {
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..4u64 {
                let add = 1_000 * (w * 10 + round);
                let (status, body) = http.write("public", batch_plus(0, 40, add)).await;
                assert_eq!(status, 204, "writer {w} round {round}: {body}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sealed = admin_seal(&http, "w").await;
    assert!(sealed.iter().all(|o| o == "sealed"), "{sealed:?}");
    let after = settled(&c, Duration::from_secs(60)).await;
    assert_eq!(
        after, before,
        "every replica sealed the primary's rows: no epoch moved, no row count changed"
    );
    // Each row holds one writer's value for it.
    let rows = http
        .rows("public", "SELECT count(*), sum(v % 1000), min(v) FROM w")
        .await;
    assert_eq!(
        (rows[0][0].as_u64(), rows[0][1].as_u64()),
        (Some(40), Some((0..40).sum::<u64>()))
    );
    assert!(rows[0][2].as_u64().unwrap() >= 10_000, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_rows_differ_is_refused_at_seal_and_repaired_from_the_primary() {
    use sealion_common::proto::storage_client::StorageClient;
    use sealion_common::proto::{DeletePredicate, DeleteRequest, PartitionStatsRequest, TagMatch};

    let c = ProcCluster::start(1, 3, 3, &[]).await;
    let http = c.http.clone();
    let mut next = 0u64;
    for _ in 0..4 {
        let (status, body) = http.write("public", batch(next, 40)).await;
        assert_eq!(status, 204, "{body}");
        next += 40;
    }
    let before = settled(&c, Duration::from_secs(30)).await;

    // Make one backup of the first partition differ: a delete sent to it
    // alone, as if forwarded by the primary (the kind of divergence a bug or
    // a half-applied write would leave).
    let table_id = table_id(&http, "w").await;
    let first = http
        .rows(
            "public",
            "SELECT p.partition_id, p.epoch, p.node_id, n.addr, p.rows FROM system.partitions p \
             JOIN system.nodes n ON p.node_id = n.node_id WHERE p.table_name = 'w' AND p.role <> 'primary' \
             ORDER BY p.start, p.node_id LIMIT 1",
        )
        .await;
    let (pid, epoch, backup, addr, rows) = (
        first[0][0].as_u64().unwrap(),
        first[0][1].as_u64().unwrap(),
        first[0][2].as_u64().unwrap(),
        first[0][3].as_str().unwrap().to_string(),
        first[0][4].as_u64().unwrap(),
    );
    let mut client = StorageClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let deleted = client
        .delete(DeleteRequest {
            table_id,
            partition_ids: vec![pid],
            predicate: Some(DeletePredicate {
                start_ns: i64::MIN,
                end_ns: i64::MAX,
                tags: vec![TagMatch {
                    name: "k".into(),
                    values: vec!["c0".into()],
                }],
            }),
            replicated: true,
            epochs: vec![epoch],
        })
        .await
        .unwrap()
        .into_inner()
        .rows_deleted;
    assert!(deleted > 0);
    let diverged = http
        .rows(
            "public",
            &format!(
                "SELECT rows FROM system.partitions WHERE partition_id = {pid} AND node_id = {backup}"
            ),
        )
        .await;
    assert_eq!(diverged[0][0].as_u64().unwrap(), rows - deleted);

    // The seal: the primary's copy is sealed, the differing backup refuses
    // its new file, leaves the in-sync set and is copied again from the
    // primary; the other backup seals as usual.
    let sealed = admin_seal(&http, "w").await;
    assert!(sealed.iter().all(|o| o == "sealed"), "{sealed:?}");
    let after = settled(&c, Duration::from_secs(60)).await;
    assert_eq!(
        after.iter().map(|p| p.1).collect::<Vec<_>>(),
        before.iter().map(|p| p.1).collect::<Vec<_>>(),
        "every replica holds the primary's rows again"
    );
    let (e_before, e_after) = (before[0].0, after[0].0);
    assert!(
        e_after >= e_before + 2,
        "the backup left the in-sync set and came back (epoch {e_before} -> {e_after})"
    );
    // The other partition's replicas agreed and kept their in-sync sets.
    assert_eq!(after[1].0, before[1].0);
    // The repaired copy holds the primary's rows, sealed.
    let stats = client
        .stats(PartitionStatsRequest {
            partition_ids: vec![pid],
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].rows, stats[0].sealed), (rows, true), "{stats:?}");
    assert_eq!(count_and_sum(&http).await, Some(model(next, &[])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_primary_brings_backups_that_hold_an_unacknowledged_write_into_line() {
    use arrow::array::{Int64Array, StringArray, TimestampNanosecondArray};
    use sealion_common::proto::storage_client::StorageClient;
    use sealion_common::proto::{Column, ColumnKind, DataType, PartitionRows, WriteRequest};

    let mut c = ProcCluster::start(1, 3, 3, &[]).await;
    let http = c.http.clone();
    let mut next = 0u64;
    for _ in 0..4 {
        let (status, body) = http.write("public", batch(next, 40)).await;
        assert_eq!(status, 204, "{body}");
        next += 40;
    }
    settled(&c, Duration::from_secs(30)).await;
    let table_id = table_id(&http, "w").await;
    let first = http
        .rows(
            "public",
            "SELECT p.partition_id, p.epoch, p.node_id, n.addr, p.role, p.start FROM system.partitions p \
             JOIN system.nodes n ON p.node_id = n.node_id WHERE p.table_name = 'w' \
             AND p.start = (SELECT min(start) FROM system.partitions WHERE table_name = 'w') \
             ORDER BY p.role DESC, p.node_id",
        )
        .await;
    // [primary, backup, backup]
    assert_eq!(first[0][4], "primary", "{first:?}");
    let pid = first[0][0].as_u64().unwrap();
    let epoch = first[0][1].as_u64().unwrap();
    let primary = first[0][2].as_u64().unwrap();
    let backup_addr = first[1][3].as_str().unwrap().to_string();

    // A write that reached one backup and nothing else, as one forwarded by
    // a primary that then died: never acknowledged to anyone.
    let columns = vec![
        Column {
            name: "time".into(),
            kind: ColumnKind::Time as i32,
            data_type: DataType::Timestamp as i32,
        },
        Column {
            name: "k".into(),
            kind: ColumnKind::Tag as i32,
            data_type: DataType::String as i32,
        },
        Column {
            name: "v".into(),
            kind: ColumnKind::Field as i32,
            data_type: DataType::Int64 as i32,
        },
    ];
    let rows = arrow::record_batch::RecordBatch::try_new(
        sealion_common::catalog::arrow_schema(&columns),
        vec![
            std::sync::Arc::new(
                TimestampNanosecondArray::from(vec![base_ns() + 7_000_000_000])
                    .with_timezone("UTC"),
            ),
            std::sync::Arc::new(StringArray::from(vec!["unacked"])),
            std::sync::Arc::new(Int64Array::from(vec![1_000_000i64])),
        ],
    )
    .unwrap();
    let mut ipc = Vec::new();
    {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut ipc, &rows.schema()).unwrap();
        w.write(&rows).unwrap();
        w.finish().unwrap();
    }
    let mut client = StorageClient::connect(format!("http://{backup_addr}"))
        .await
        .unwrap();
    let written = client
        .write(WriteRequest {
            table_id,
            columns,
            partitions: vec![PartitionRows {
                partition_id: pid,
                epoch,
                arrow_ipc: ipc,
            }],
            replicated: true,
            batch_id: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .rows_written;
    assert_eq!(written, 1);

    // The primary dies; a backup is promoted. Before it acts at its new
    // epoch it compares its rows with the other in-sync backup's: one of
    // the two holds the unacknowledged row, so that one is out of line and
    // is brought back by a resync.
    let pi = c.index_of(primary).await;
    c.storages[pi].kill();
    let converged = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (s, b) = http
                .sql(
                    "public",
                    &format!(
                        "SELECT min(rows), max(rows), count(*) FILTER (WHERE in_sync), max(epoch) \
                         FROM system.partitions WHERE partition_id = {pid} AND node_id <> {primary}"
                    ),
                )
                .await;
            if s == 200 {
                let r = &b["rows"][0];
                if r[0] == r[1] && r[2] == 2 {
                    return r[3].as_u64().unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    let Ok(epoch_after) = converged else {
        c.dump();
        panic!("the two live replicas did not come into line");
    };
    assert!(
        epoch_after >= epoch + 3,
        "promotion, the differing backup's removal and its resync (epoch {epoch} -> {epoch_after})"
    );
    // The acknowledged rows are all there; the unacknowledged one is there
    // or not, the same on both.
    let (status, b) = http
        .sql(
            "public",
            "SELECT count(*), sum(v) FROM w WHERE k <> 'unacked'",
        )
        .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(
        (b["rows"][0][0].as_u64(), b["rows"][0][1].as_u64()),
        (Some(model(next, &[]).0), Some(model(next, &[]).1))
    );
}

/// The id of table `name` in database public.
async fn table_id(http: &Http, name: &str) -> u64 {
    http.rows(
        "public",
        &format!("SELECT table_id FROM system.tables WHERE table_name = '{name}'"),
    )
    .await[0][0]
        .as_u64()
        .unwrap()
}
