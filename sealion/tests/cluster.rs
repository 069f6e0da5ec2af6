//! A real cluster: 3 meta replicas, 2 storage nodes and 1 query node as
//! separate processes on loopback. Rows go in by line protocol and by
//! `INSERT` over pgwire; answers are checked against a model after killing
//! and restarting a storage node and a meta follower, and after killing the
//! meta leader.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

async fn wait_healthy(http: &Http, procs: &[&Proc]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !http.healthy().await {
        if std::time::Instant::now() > deadline {
            for p in procs {
                eprintln!("--- {} ---\n{}", p.name, p.log_text());
            }
            panic!("cluster did not become healthy");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_answering_through_node_and_meta_failures() {
    // One replica per partition: this test is about a node's death failing
    // what needs it. Replication has its own tests.
    let ProcCluster {
        mut metas,
        meta_addrs,
        mut storages,
        query,
        http,
        pg_addr,
        _dir,
    } = ProcCluster::start(3, 2, 1, &[]).await;
    // Both storage nodes registered.
    storage_nodes_up(&http, 2, Duration::from_secs(60)).await;

    // Create by SQL, write by line protocol and by INSERT over pgwire.
    let pg = pg_connect(&pg_addr, "public").await;
    pg.simple_query(
        "CREATE TABLE cpu (host TEXT, region TEXT, usage DOUBLE, n BIGINT, time TIMESTAMP NOT NULL, \
         PRIMARY KEY (host, region, time))",
    )
    .await
    .unwrap();
    let data = Dataset {
        hosts: 6,
        days: 4,
        step_s: 1_800,
    };
    let batches = data.batches(500);
    let (last, first) = batches.split_last().unwrap();
    for b in first {
        let (status, body) = http.write("public", b.clone()).await;
        assert_eq!(status, 204, "{body}");
    }
    // The last batch goes in as INSERT statements over pgwire.
    let rows = data.rows();
    let tail = &rows[rows.len() - last.lines().count()..];
    for chunk in tail.chunks(50) {
        let values: Vec<String> = chunk
            .iter()
            .map(|(h, t, v)| format!("('host_{h}', 'r{}', {v}.0, {v}, to_timestamp({t}))", h % 3))
            .collect();
        let n = pg
            .execute(
                &format!(
                    "INSERT INTO cpu (host, region, usage, n, time) VALUES {}",
                    values.join(",")
                ),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(n as usize, chunk.len());
    }
    check_per_host(&http, &pg_addr, &data).await;
    // Partitions are spread over both nodes.
    let nodes = http
        .rows(
            "public",
            "SELECT count(DISTINCT node_id) FROM system.partitions",
        )
        .await;
    assert_eq!(nodes[0][0], 2, "partitions on both storage nodes");

    // Kill a storage node: writes to its partitions fail loudly, never silently.
    let victim_id = {
        let r = http
            .rows(
                "public",
                "SELECT node_id FROM system.partitions WHERE start = '2024-01-01T00:00:00Z'",
            )
            .await;
        r[0][0].as_u64().unwrap()
    };
    // Storage processes register in start order, but ids come from meta; find the process by address.
    let victim_addr = http
        .rows(
            "public",
            &format!("SELECT addr FROM system.nodes WHERE node_id = {victim_id}"),
        )
        .await[0][0]
        .as_str()
        .unwrap()
        .to_string();
    let vi = storages
        .iter()
        .position(|p| p.args.contains(&victim_addr))
        .unwrap();
    storages[vi].kill();
    let (status, body) = http
        .write(
            "public",
            format!(
                "cpu,host=host_0,region=r0 usage=1.0,n=1i {}\n",
                DAY0_S * 1_000_000_000
            ),
        )
        .await;
    assert_eq!(status, 503, "write to a dead node's partition: {body}");
    // A query whose time range lies in partitions of the live node never
    // contacts the dead one: pruning happens before any node is asked.
    let live_day = http
        .rows("public", &format!("SELECT start, \"end\" FROM system.partitions WHERE node_id <> {victim_id} ORDER BY start LIMIT 1"))
        .await;
    let (from, to) = (
        live_day[0][0].as_str().unwrap().to_string(),
        live_day[0][1].as_str().unwrap().to_string(),
    );
    let (status, body) = http
        .sql(
            "public",
            &format!("SELECT count(*) FROM cpu WHERE time >= '{from}' AND time < '{to}'"),
        )
        .await;
    assert_eq!(status, 200, "a query that needs only the live node: {body}");
    assert_eq!(
        body["rows"][0][0].as_u64().unwrap() as usize,
        data.hosts * 48
    );
    let (status, _) = http.sql("public", "SELECT count(*) FROM cpu").await;
    assert!(
        status >= 500,
        "a query that needs the dead node fails, it does not answer short"
    );
    storages[vi].restart();
    eventually("storage node back", Duration::from_secs(60), || async {
        let (s, b) = http.sql("public", PER_HOST_SQL).await;
        (s == 200 && b["rows"].as_array().map_or(0, |r| r.len()) == data.hosts).then_some(())
    })
    .await;
    // The failed write was not applied anywhere; the data is exactly the model.
    check_per_host(&http, &pg_addr, &data).await;

    // Kill a meta follower, keep working, bring it back.
    eventually("three meta voters", Duration::from_secs(60), || {
        meta_voters(&meta_addrs, 3)
    })
    .await;
    let leader = eventually("a meta leader", Duration::from_secs(30), || {
        meta_leader(&meta_addrs)
    })
    .await;
    let follower = (0..3).find(|&i| i as u64 + 1 != leader).unwrap();
    metas[follower].kill();
    let (status, body) = http.write("public", "extra,host=a v=1.0 1\n".into()).await;
    assert_eq!(status, 204, "{body}");
    metas[follower].restart();
    check_per_host(&http, &pg_addr, &data).await;

    // Kill the meta leader: a new one is elected and the cluster keeps serving.
    let leader = eventually("a meta leader", Duration::from_secs(30), || {
        meta_leader(&meta_addrs)
    })
    .await;
    metas[leader as usize - 1].kill();
    let others: Vec<String> = meta_addrs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 + 1 != leader)
        .map(|(_, a)| a.clone())
        .collect();
    let new_leader = eventually("a new meta leader", Duration::from_secs(60), || async {
        meta_leader(&others).await.filter(|l| *l != leader)
    })
    .await;
    assert_ne!(new_leader, leader);
    let (status, body) = http.write("public", "extra2,host=b v=2.0 2\n".into()).await;
    assert_eq!(
        status, 204,
        "a write that creates a table after the leader died: {body}"
    );
    check_per_host(&http, &pg_addr, &data).await;
    assert_eq!(
        http.rows("public", "SELECT v FROM extra2").await,
        vec![vec![serde_json::json!(2.0)]]
    );
    drop(query);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealion_cluster_command_runs_a_working_cluster_and_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let pg_port = free_port();
    let base = free_base_port();
    let mut launcher = Proc::start(
        "cluster",
        &[
            "cluster".into(),
            "--meta".into(),
            "3".into(),
            "--storage".into(),
            "3".into(),
            "--query".into(),
            "1".into(),
            "--data-dir".into(),
            dir.path().join("c").display().to_string(),
            "--base-port".into(),
            base.to_string(),
            "--http-port".into(),
            http_port.to_string(),
            "--pg-port".into(),
            pg_port.to_string(),
        ],
        dir.path(),
    );
    let http = Http::new(&format!("127.0.0.1:{http_port}"));
    wait_healthy(&http, &[&launcher]).await;
    storage_nodes_up(&http, 3, Duration::from_secs(60)).await;
    let data = Dataset {
        hosts: 10,
        days: 3,
        step_s: 900,
    };
    for b in data.batches(1_000) {
        let (status, body) = http.write("public", b).await;
        assert_eq!(status, 204, "{body}");
    }
    check_per_host(&http, &format!("127.0.0.1:{pg_port}"), &data).await;
    let parts = http.rows("public", "SELECT count(*), count(DISTINCT partition_id), count(DISTINCT node_id) FILTER (WHERE role = 'primary'), bool_and(in_sync) FROM system.partitions WHERE table_name = 'cpu'").await;
    assert_eq!(
        parts[0],
        vec![
            serde_json::json!(9),
            serde_json::json!(3),
            serde_json::json!(3),
            serde_json::json!(true)
        ],
        "one partition per day, three replicas each (the default), all in sync, primaries on every node"
    );

    // The launcher prints every process and its pid, and SIGTERM stops them all.
    let log = launcher.log_text();
    for name in [
        "meta-1",
        "meta-2",
        "meta-3",
        "storage-1",
        "storage-2",
        "storage-3",
        "query-1",
    ] {
        assert!(
            log.contains(name) && log.contains("pid"),
            "{name} missing from:\n{log}"
        );
    }
    launcher.stop();
    for port in [
        base + 1,
        base + 2,
        base + 3,
        base + 101,
        base + 102,
        base + 103,
        http_port,
        pg_port,
    ] {
        eventually(
            "every child to exit",
            Duration::from_secs(20),
            || async move {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .is_err()
                    .then_some(())
            },
        )
        .await;
    }
}

/// A table with shards: each day is split into three partitions, each
/// series lives in exactly one of them, every query over the table answers
/// as over one partition per day, and the shards' primaries spread over the
/// nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_table_spreads_each_day_over_shards_and_answers_the_same() {
    let c = ProcCluster::start(1, 3, 2, &[]).await;
    let http = c.http.clone();
    let (status, body) = http
        .sql(
            "public",
            "CREATE TABLE cpu (host TEXT, region TEXT, usage DOUBLE, n BIGINT, time TIMESTAMP NOT NULL, \
             PRIMARY KEY (host, region, time)) WITH (shards = 3)",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for bad in ["0", "257", "'x'"] {
        let (status, body) = http
            .sql(
                "public",
                &format!(
                    "CREATE TABLE bad (v DOUBLE, time TIMESTAMP NOT NULL) WITH (shards = {bad})"
                ),
            )
            .await;
        assert_eq!(status, 400, "shards = {bad}: {body}");
        assert!(body.to_string().contains("shards"), "{body}");
    }
    // A table may ask for its own number of replicas.
    let (status, body) = http
        .sql(
            "public",
            "CREATE TABLE solo (v DOUBLE, time TIMESTAMP NOT NULL) WITH (replication_factor = 1)",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http
        .write("public", "solo v=1.0 1704067200000000000\n".into())
        .await;
    assert_eq!(status, 204, "{body}");
    let solo = http
        .rows(
            "public",
            "SELECT count(*), min(t.replication_factor) FROM system.partitions p \
             JOIN system.tables t ON p.table_name = t.table_name AND p.database = t.database WHERE p.table_name = 'solo'",
        )
        .await;
    assert_eq!(solo, vec![vec![serde_json::json!(1), serde_json::json!(1)]]);
    let (status, body) = http
        .sql(
            "public",
            "CREATE TABLE bad (v DOUBLE, time TIMESTAMP NOT NULL) WITH (replication_factor = 8)",
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let data = Dataset {
        hosts: 12,
        days: 2,
        step_s: 900,
    };
    for b in data.batches(500) {
        let (status, body) = http.write("public", b).await;
        assert_eq!(status, 204, "{body}");
    }
    check_per_host(&http, &c.pg_addr, &data).await;

    let shards = http
        .rows(
            "public",
            "SELECT start, count(DISTINCT shard), min(shard), max(shard), count(*) \
             FROM system.partitions WHERE table_name = 'cpu' GROUP BY start ORDER BY start",
        )
        .await;
    assert_eq!(shards.len(), 2, "{shards:?}");
    for day in &shards {
        assert_eq!(
            (&day[1], &day[2], &day[3], &day[4]),
            (
                &serde_json::json!(3),
                &serde_json::json!(0),
                &serde_json::json!(2),
                &serde_json::json!(6)
            ),
            "three shards a day, two replicas each: {shards:?}"
        );
    }
    let primaries = http
        .rows(
            "public",
            "SELECT count(DISTINCT node_id) FROM system.partitions WHERE table_name = 'cpu' AND role = 'primary'",
        )
        .await;
    assert!(primaries[0][0].as_u64().unwrap() >= 2, "{primaries:?}");
    // Every shard holds rows, and the replicas of a shard agree.
    let per_partition = http
        .rows(
            "public",
            "SELECT partition_id, min(rows), max(rows) FROM system.partitions \
             WHERE table_name = 'cpu' GROUP BY partition_id",
        )
        .await;
    let mut total = 0;
    for r in &per_partition {
        assert_eq!(r[1], r[2], "{per_partition:?}");
        assert!(
            r[1].as_u64().unwrap() > 0,
            "an empty shard: {per_partition:?}"
        );
        total += r[1].as_u64().unwrap();
    }
    assert_eq!(total as usize, data.rows().len());
    // Each series lives in one shard per day: the rows of a day split
    // between shards exactly as the series do (whole series per shard).
    let per_day_rows = 86_400 / data.step_s as u64;
    for r in &per_partition {
        assert_eq!(
            r[1].as_u64().unwrap() % per_day_rows,
            0,
            "a shard holds whole series: {per_partition:?}"
        );
    }

    // The newest rows, the last point of every host, and a time-ordered
    // lookup read the shards of a day together.
    let newest = http.rows("public", "SELECT max(time) FROM cpu").await;
    let top = http
        .rows(
            "public",
            "SELECT time, host FROM cpu ORDER BY time DESC, host LIMIT 3",
        )
        .await;
    assert_eq!(top.len(), 3);
    assert!(
        top.iter().all(|r| r[0] == newest[0][0]),
        "{top:?} vs {newest:?}"
    );
    // Pushed to the nodes as a time-ordered scan. Where a day's shards
    // have their primaries on several nodes, the nodes' answers interleave
    // and the sort above the scan stays to merge them; only where every
    // day is on one node does the scan declare its order instead.
    let spread = http
        .rows(
            "public",
            "SELECT start, count(DISTINCT node_id) FROM system.partitions \
             WHERE table_name = 'cpu' AND role = 'primary' GROUP BY start",
        )
        .await;
    let day_on_several_nodes = spread.iter().any(|r| r[1].as_u64().unwrap() > 1);
    let q = "SELECT time, host FROM cpu ORDER BY time DESC LIMIT 4";
    let top = http.rows("public", q).await;
    assert_eq!(top.len(), 4);
    assert!(
        top.iter().all(|r| r[0] == newest[0][0]),
        "{top:?} vs {newest:?}"
    );
    let plan: Vec<String> = http
        .rows("public", &format!("EXPLAIN {q}"))
        .await
        .iter()
        .map(|r| format!("{} {}", r[0], r[1]))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("SealionRows"), "{plan}");
    assert_eq!(
        plan.contains("SortExec"),
        day_on_several_nodes,
        "{spread:?}\n{plan}"
    );
    let last = http
        .rows(
            "public",
            "SELECT DISTINCT ON (host) host, time, usage FROM cpu ORDER BY host, time DESC",
        )
        .await;
    assert_eq!(last.len(), data.hosts);
    let end_s = DAY0_S + data.days * 86_400 - data.step_s;
    for r in &last {
        let h: usize = r[0].as_str().unwrap()["host_".len()..].parse().unwrap();
        assert_eq!(
            r[2].as_f64().unwrap(),
            Dataset::value(h, end_s) as f64,
            "{r:?}"
        );
    }
    let one = http
        .rows(
            "public",
            "SELECT count(*), sum(n) FROM cpu WHERE host = 'host_5'",
        )
        .await;
    let want: i64 = data.rows().iter().filter(|r| r.0 == 5).map(|r| r.2).sum();
    assert_eq!(
        one[0][0].as_u64().unwrap() as usize,
        data.rows().len() / data.hosts
    );
    assert_eq!(one[0][1].as_i64().unwrap(), want);
    // A DELETE and a seal reach every shard.
    let (status, body) = http
        .sql("public", "DELETE FROM cpu WHERE host = 'host_5'")
        .await;
    assert_eq!(status, 200, "{body}");
    let sealed = admin_seal(&http, "cpu").await;
    assert_eq!(sealed.len(), 6, "{sealed:?}");
    assert!(sealed.iter().all(|o| o == "sealed"), "{sealed:?}");
    let after = per_host_over_http(&http, "true").await;
    let want: Vec<_> = data
        .per_host()
        .into_iter()
        .filter(|r| r.0 != "host_5")
        .collect();
    assert_eq!(after, want);
}
