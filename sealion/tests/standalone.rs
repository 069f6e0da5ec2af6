//! `sealion standalone` as a user runs it: write, query over HTTP and
//! pgwire, restart, and every bad input a user can send.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_answers_exactly_and_keeps_data_across_a_restart() {
    let mut s = start_standalone().await;
    let data = Dataset {
        hosts: 10,
        days: 3,
        step_s: 600,
    };
    write_dataset(&s.http, &data, 1_000).await;
    check_per_host(&s.http, &s.pg_addr, &data).await;
    let parts = s
        .http
        .rows("public", "SELECT start, \"end\", state, rows FROM system.partitions WHERE table_name = 'cpu' ORDER BY start")
        .await;
    assert_eq!(parts.len(), 3, "one partition per day: {parts:?}");
    let rows: i64 = parts.iter().map(|p| p[3].as_i64().unwrap()).sum();
    assert_eq!(rows as usize, data.rows().len());
    assert!(parts.iter().all(|p| p[2] == "open"));
    assert_eq!(parts[0][0], "2024-01-01T00:00:00Z");

    // A time range reads only what it covers.
    let day2 = s
        .http
        .rows("public", "SELECT count(*) FROM cpu WHERE time >= '2024-01-02T00:00:00Z' AND time < '2024-01-03T00:00:00Z'")
        .await;
    assert_eq!(day2[0][0].as_i64().unwrap(), 10 * 144);

    // Last write wins on (series, time).
    let (status, _) = s
        .http
        .write(
            "public",
            format!(
                "cpu,host=host_0,region=r0 usage=1000.0,n=1i {}\n",
                DAY0_S * 1_000_000_000
            ),
        )
        .await;
    assert_eq!(status, 204);
    let v = s
        .http
        .rows(
            "public",
            "SELECT usage FROM cpu WHERE host = 'host_0' AND time = '2024-01-01T00:00:00Z'",
        )
        .await;
    assert_eq!(v, vec![vec![serde_json::json!(1000.0)]]);
    let (status, _) = s
        .http
        .write(
            "public",
            format!(
                "cpu,host=host_0,region=r0 usage={}.0,n={}i {}\n",
                Dataset::value(0, DAY0_S),
                Dataset::value(0, DAY0_S),
                DAY0_S * 1_000_000_000
            ),
        )
        .await;
    assert_eq!(status, 204);

    s.proc_.stop();
    s.proc_.restart();
    wait_healthy(&s.http, &mut s.proc_).await;
    check_per_host(&s.http, &s.pg_addr, &data).await;
    let parts = s
        .http
        .rows(
            "public",
            "SELECT count(*) FROM system.partitions WHERE table_name = 'cpu'",
        )
        .await;
    assert_eq!(parts[0][0].as_i64().unwrap(), 3);

    // A kill (no clean shutdown) loses no acknowledged write either.
    let (status, _) = s
        .http
        .write("public", "after_kill,host=a v=1.0 1\n".into())
        .await;
    assert_eq!(status, 204);
    s.proc_.kill();
    s.proc_.restart();
    wait_healthy(&s.http, &mut s.proc_).await;
    assert_eq!(
        s.http.rows("public", "SELECT v FROM after_kill").await,
        vec![vec![serde_json::json!(1.0)]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ddl_insert_and_system_tables() {
    let s = start_standalone().await;
    let pg = pg_connect(&s.pg_addr, "public").await;
    pg.simple_query(
        "CREATE TABLE weather (city TEXT, temp DOUBLE, humid BIGINT, time TIMESTAMP NOT NULL, \
         PRIMARY KEY (city, time)) WITH (partition_interval = '1h')",
    )
    .await
    .unwrap();
    let n = pg
        .execute(
            "INSERT INTO weather (city, temp, humid, time) VALUES ('oslo', 1.5, 80, '2024-05-01T10:00:00Z'), \
             ('rome', 21.0, 40, '2024-05-01T11:30:00Z')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 2);
    let rows = pg
        .query("SELECT city, temp, humid FROM weather ORDER BY city", &[])
        .await
        .unwrap();
    let got: Vec<(String, f64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![("oslo".into(), 1.5, 80), ("rome".into(), 21.0, 40)]
    );

    let parts = s
        .http
        .rows(
            "public",
            "SELECT count(*) FROM system.partitions WHERE table_name = 'weather'",
        )
        .await;
    assert_eq!(parts[0][0].as_i64().unwrap(), 2, "two one-hour partitions");
    let tables = s.http.rows("public", "SHOW TABLES").await;
    assert!(
        tables.contains(&vec![serde_json::json!("weather")]),
        "{tables:?}"
    );
    let cols = s.http.rows("public", "SHOW COLUMNS FROM weather").await;
    assert_eq!(
        cols[0],
        vec![
            serde_json::json!("time"),
            serde_json::json!("TIMESTAMP"),
            serde_json::json!("time")
        ]
    );
    assert!(cols.contains(&vec![
        serde_json::json!("city"),
        serde_json::json!("TEXT"),
        serde_json::json!("tag")
    ]));
    let nodes = s
        .http
        .rows("public", "SELECT state FROM system.nodes")
        .await;
    assert_eq!(nodes, vec![vec![serde_json::json!("up")]]);
    let t = s
        .http
        .rows("public", "SELECT table_name FROM system.tables")
        .await;
    assert_eq!(t, vec![vec![serde_json::json!("weather")]]);

    // Other databases are chosen by name, over HTTP and pgwire.
    let (status, body) = s.http.write("metrics", "m,host=a v=1i 1\n".into()).await;
    assert_eq!(status, 204, "{body}");
    let other = pg_connect(&s.pg_addr, "metrics").await;
    let rows = other.query("SELECT v FROM m", &[]).await.unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 1);
    let (status, _) = s.http.sql("public", "SELECT * FROM m").await;
    assert_eq!(status, 404, "m lives in database metrics only");

    pg.simple_query("DROP TABLE weather").await.unwrap();
    let err = pg.query("SELECT * FROM weather", &[]).await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42P01");
    let (_, csv) = (
        0,
        s.http
            .client
            .get(format!(
                "{}/api/v1/sql?db=metrics&q=SELECT%20v%20FROM%20m&format=csv",
                s.http.base
            ))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(csv, "v\n1\n");
    let jsonl = s
        .http
        .client
        .get(format!(
            "{}/api/v1/sql?db=metrics&q=SELECT%20v%20FROM%20m&format=jsonl",
            s.http.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(jsonl, "{\"v\":1}\n");
    let metrics = s
        .http
        .client
        .get(format!("{}/metrics", s.http.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sealion_http_write_requests_total"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_loses_nothing_else() {
    let s = start_standalone().await;
    // Malformed lines: 400 naming each bad line; the good lines are stored.
    let body =
        "t,host=a v=1.0 1000\nnot line protocol at all\nt,host=b v=2.0 2000\nt,host=c v= 3000\n"
            .to_string();
    let (status, text) = s.http.write("public", body).await;
    assert_eq!(status, 400);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let lines: Vec<i64> = v["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["line"].as_i64().unwrap())
        .collect();
    assert_eq!(lines, vec![2, 4], "{text}");
    assert_eq!(v["rows_written"], 2);
    assert_eq!(
        s.http.rows("public", "SELECT count(*) FROM t").await[0][0],
        2
    );

    // A field that changes type is refused for that line only.
    let (status, text) = s
        .http
        .write("public", "t,host=d v=5i 4000\nt,host=e v=6.0 5000\n".into())
        .await;
    assert_eq!(status, 400);
    assert!(text.contains("field v is DOUBLE"), "{text}");
    assert_eq!(
        s.http.rows("public", "SELECT count(*) FROM t").await[0][0],
        3
    );

    // Timestamps out of range.
    let (status, text) = s
        .http
        .client
        .post(format!("{}/api/v1/write?precision=s", s.http.base))
        .body("t,host=f v=1.0 9223372036854775\nt,host=g v=1.0 1\n")
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(status, 400);
    assert!(text.text().await.unwrap().contains("out of range"));
    assert_eq!(
        s.http.rows("public", "SELECT count(*) FROM t").await[0][0],
        4
    );

    // Too large a body. The server answers before reading it all and then
    // closes that connection, so it goes through a client that keeps no
    // idle connection (a pooled one could be handed to the next request
    // just as it closes).
    // The close can also come while the client is still writing the body
    // (a broken pipe before it reads the answer): that attempt says nothing
    // about the server and is made again.
    let big = "x".repeat(33 << 20);
    let once = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut refused = None;
    for _ in 0..10 {
        match once
            .post(format!("{}/api/v1/write", s.http.base))
            .body(big.clone())
            .send()
            .await
        {
            Ok(r) => {
                refused = Some(r.status().as_u16());
                break;
            }
            Err(e) if e.is_request() => continue,
            Err(e) => panic!("too large a body: {e}"),
        }
    }
    assert_eq!(refused, Some(413), "too large a body is refused with 413");
    let (status, _) = s.http.write("public", "t v=1.0 1\n".into()).await;
    assert_eq!(status, 204, "the server still works after a refused body");

    // Bad precision.
    let r = s
        .http
        .client
        .post(format!("{}/api/v1/write?precision=fortnight", s.http.base))
        .body("t v=1.0 1\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    // Unknown table and column: 4xx JSON over HTTP, SQLSTATE over pgwire.
    let (status, body) = s.http.sql("public", "SELECT * FROM nope").await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("nope"), "{body}");
    let (status, body) = s.http.sql("public", "SELECT nope FROM t").await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = s.http.sql("public", "SELEKT 1").await;
    assert_eq!(status, 400);
    let pg = pg_connect(&s.pg_addr, "public").await;
    let e = pg.query("SELECT * FROM nope", &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "42P01", "{e}");
    let e = pg.simple_query("SELECT * FROM nope").await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "42P01", "{e}");
    let e = pg.query("SELECT nope FROM t", &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "42703", "{e}");
    let e = pg.simple_query("SELECT nope FROM t").await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "42703", "{e}");
    // The connection is still usable after errors.
    let rows = pg.query("SELECT count(*) FROM t", &[]).await.unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 5);
}

/// A session cannot change the node's DataFusion options: they are shared
/// by every session and tenant (a `SET` that datafusion-postgres would run
/// on the shared context held for every later query, HTTP ones too). The
/// variables drivers set on connect still answer `SET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_set_options_for_every_other_session() {
    let s = start_standalone().await;
    let default = s
        .http
        .rows("public", "SHOW datafusion.execution.batch_size")
        .await[0][1]
        .clone();
    let pg = pg_connect(&s.pg_addr, "public").await;
    for q in [
        "SET datafusion.execution.batch_size = 2",
        "SET DataFusion.Execution.Batch_Size TO 3",
        "SET LOCAL datafusion.optimizer.max_passes = 1",
    ] {
        let e = pg.simple_query(q).await.unwrap_err();
        assert_eq!(e.code().unwrap().code(), "0A000", "{q}: {e}");
        let e = pg.execute(q, &[]).await.unwrap_err();
        assert_eq!(e.code().unwrap().code(), "0A000", "{q}: {e}");
    }
    // What drivers send on connect is still taken.
    pg.simple_query("SET application_name = 'dashboards'")
        .await
        .unwrap();
    pg.simple_query("SET extra_float_digits = 3").await.unwrap();
    pg.simple_query("SET TIME ZONE 'UTC'").await.unwrap();
    // Nothing changed for anyone (the HTTP API reads the node's options;
    // pgwire's SHOW answers only PostgreSQL's variables), and the session
    // still works.
    assert_eq!(
        s.http
            .rows("public", "SHOW datafusion.execution.batch_size")
            .await[0][1],
        default
    );
    let rows = pg.query("SELECT 1 + 1", &[]).await.unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 2);
}

/// psycopg, Python's driver, speaks the extended protocol with its own type
/// handling. The check runs where Python has psycopg; CI installs it and
/// sets SEALION_REQUIRE_PSYCOPG=1 so a missing driver fails there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_can_create_insert_and_query() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import psycopg"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has {
        assert!(
            std::env::var("SEALION_REQUIRE_PSYCOPG").is_err(),
            "SEALION_REQUIRE_PSYCOPG is set but python3 cannot import psycopg"
        );
        eprintln!("psycopg not installed: skipping (pip install 'psycopg[binary]')");
        return;
    }
    let s = start_standalone().await;
    let (host, port) = s.pg_addr.rsplit_once(':').unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/psycopg_check.py"
    );
    let out = tokio::process::Command::new("python3")
        .args([script, host, port])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "psycopg check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_a_toml_file() {
    let dir = tempfile::tempdir().unwrap();
    let http_addr = format!("127.0.0.1:{}", free_port());
    let pg_addr = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("sealion.toml");
    std::fs::write(
        &config,
        format!(
            "http-addr = \"{http_addr}\"\npg_addr = \"{pg_addr}\"\ndata-dir = \"{}\"\n",
            dir.path().join("from-toml").display()
        ),
    )
    .unwrap();
    let mut p = Proc::start(
        "standalone-toml",
        &[
            "standalone".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        dir.path(),
    );
    wait_healthy(&Http::new(&http_addr), &mut p).await;
    let _pg = pg_connect(&pg_addr, "public").await;
    assert!(
        dir.path().join("from-toml").join("meta").exists(),
        "data went to the configured directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_refuses_old_rows_and_drops_whole_partitions_from_meta_and_storage() {
    let s = start_standalone_with(&[
        "--retention-check-interval-ms",
        "200",
        "--sweep-interval-ms",
        "200",
    ])
    .await;
    let pg = pg_connect(&s.pg_addr, "public").await;
    pg.simple_query(
        "CREATE TABLE r (host TEXT, v DOUBLE, time TIMESTAMP NOT NULL, PRIMARY KEY (host, time)) \
         WITH (retention = '3s', partition_interval = '1s')",
    )
    .await
    .unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let second = 1_000_000_000i64;
    // A row already past the retention is refused by line; the others are kept.
    let body = format!(
        "r,host=a v=1.0 {}\nr,host=a v=2.0 {}\nr,host=b v=3.0 {}\n",
        now_ns - 60 * second,
        now_ns,
        now_ns - second
    );
    let (status, text) = s.http.write("public", body).await;
    assert_eq!(status, 400, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["rows_written"], 2, "{text}");
    assert_eq!(v["rejected"][0]["line"], 1, "{text}");
    assert!(text.contains("retention"), "{text}");
    // INSERT refuses such rows too.
    let e = pg
        .simple_query(&format!(
            "INSERT INTO r (host, v, time) VALUES ('c', 1.0, to_timestamp_nanos({}))",
            now_ns - 60 * second
        ))
        .await
        .unwrap_err();
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("retention"), "{e:?}");
    // A partition for each second written (and, when a row's second was
    // still the present for the router, the next one, made ahead).
    let parts = s
        .http
        .rows(
            "public",
            &format!(
                "SELECT count(*) FILTER (WHERE start <= to_timestamp_nanos({now_ns})), count(*) \
                 FROM system.partitions WHERE table_name = 'r'"
            ),
        )
        .await;
    assert_eq!(
        parts[0][0], 2,
        "one partition per second written: {parts:?}"
    );
    assert!(parts[0][1] == 2 || parts[0][1] == 3, "{parts:?}");

    // Seconds later both partitions are past the retention: meta drops them
    // from the map, and the storage node deletes their rows.
    eventually(
        "the partitions to expire",
        Duration::from_secs(30),
        || async {
            let rows = s
                .http
                .rows(
                    "public",
                    "SELECT count(*) FROM system.partitions WHERE table_name = 'r'",
                )
                .await;
            (rows[0][0] == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        s.http.rows("public", "SELECT count(*) FROM r").await[0][0],
        0
    );
    eventually(
        "storage to sweep the expired partitions",
        Duration::from_secs(30),
        || async {
            let text = s
                .http
                .client
                .get(format!("{}/metrics", s.http.base))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .any(|l| {
                    l.starts_with("sealion_storage_partitions_swept_total") && l.ends_with(" 2")
                })
                .then_some(())
        },
    )
    .await;
}

/// Writes `data` through line protocol, `per_batch` rows a request; every
/// request must be acknowledged.
async fn write_dataset(http: &Http, data: &Dataset, per_batch: usize) {
    for batch in data.batches(per_batch) {
        let (status, body) = http.write("public", batch).await;
        assert_eq!(status, 204, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealing_on_demand_keeps_answers_and_late_rows_win_until_a_reseal() {
    let mut s = start_standalone_with(&["--seal-check-interval-ms", "0"]).await;
    let data = Dataset {
        hosts: 10,
        days: 3,
        step_s: 300,
    };
    write_dataset(&s.http, &data, 2_000).await;
    check_per_host(&s.http, &s.pg_addr, &data).await;
    assert_eq!(admin_seal(&s.http, "cpu").await, vec!["sealed"; 3]);
    let parts = s
        .http
        .rows(
            "public",
            "SELECT state, rows, late_rows, tag_filter_bytes FROM system.partitions WHERE table_name = 'cpu'",
        )
        .await;
    assert_eq!(parts.len(), 3);
    for p in &parts {
        assert_eq!(p[0], "sealed");
        assert_eq!(p[1], 10 * 288);
        assert_eq!(p[2], 0);
        // Each sealed partition published its tag filters to meta: a few
        // hundred bytes for 10 hosts and their regions.
        let filter = p[3].as_u64().unwrap_or(0);
        assert!(filter > 0 && filter < 4096, "tag filter of {filter} bytes");
    }
    check_per_host(&s.http, &s.pg_addr, &data).await;

    // With no time predicate, a host no sealed partition holds is answered
    // without contacting any partition; a host they hold reads all three.
    let pruned = || async {
        counter(
            &s.http,
            "sealion_query_partitions_pruned_by_tag_filter_total",
        )
        .await
    };
    // A tag filter may say "maybe" for a value it does not hold (about 0.4%
    // of lookups for 8-bit fingerprints), so ten absent hosts are asked and
    // at most two of the thirty partition lookups may come out "maybe".
    let before = pruned().await;
    for k in 0..10 {
        let rows = s
            .http
            .rows(
                "public",
                &format!("SELECT count(*) FROM cpu WHERE host = 'host_nope_{k}'"),
            )
            .await;
        assert_eq!(rows[0][0], 0);
    }
    let skipped = pruned().await - before;
    assert!((28.0..=30.0).contains(&skipped), "{skipped} of 30 pruned");
    let before = pruned().await;
    let rows = s
        .http
        .rows(
            "public",
            "SELECT count(*), max(usage) FROM cpu WHERE host = 'host_3' AND usage >= 0",
        )
        .await;
    assert_eq!(rows[0][0], 3 * 288);
    assert_eq!(pruned().await - before, 0.0, "host_3 is in every partition");

    // EXPLAIN shows the pruning; EXPLAIN ANALYZE what the node read.
    let plan = |q: &'static str| {
        let http = &s.http;
        async move {
            let rows = http.rows("public", q).await;
            rows.iter()
                .flat_map(|r| r.iter().map(|c| c.as_str().unwrap_or_default().to_string()))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    let p = plan("EXPLAIN SELECT count(*) FROM cpu WHERE host = 'host_nope'").await;
    for want in [
        "partitions_total=3",
        "partitions_pruned_by_time=0",
        "partitions_pruned_by_tag_filter=3",
        "partitions_scanned=0",
    ] {
        assert!(p.contains(want), "{want} in {p}");
    }
    let p = plan(
        "EXPLAIN SELECT count(*) FROM cpu WHERE time >= '2024-01-03T00:00:00Z' AND usage > 50",
    )
    .await;
    for want in [
        "partitions_pruned_by_time=2",
        "partitions_scanned=1",
        "usage CMP_GT 50",
    ] {
        assert!(p.contains(want), "{want} in {p}");
    }
    // Bounds from now() and BETWEEN prune by time (the data is from 2024).
    let p = plan("EXPLAIN SELECT count(*) FROM cpu WHERE time > now() - interval '1 day'").await;
    assert!(p.contains("partitions_pruned_by_time=3"), "{p}");
    let p = plan("EXPLAIN SELECT count(*) FROM cpu WHERE time BETWEEN '2024-01-02T00:00:00Z' AND '2024-01-02T12:00:00Z'").await;
    assert!(p.contains("partitions_pruned_by_time=2"), "{p}");
    // date_trunc bounds time by a superset: the day asked for, plus the
    // hour a zone's longest day may add (so the next day's partition stays).
    let p = plan(
        "EXPLAIN SELECT count(*) FROM cpu WHERE date_trunc('day', time) = '2024-01-01T00:00:00Z'",
    )
    .await;
    assert!(p.contains("partitions_pruned_by_time=1"), "{p}");
    let p = plan(
        "EXPLAIN SELECT count(*) FROM cpu WHERE date_trunc('hour', time) >= '2024-01-03T05:00:00Z'",
    )
    .await;
    assert!(p.contains("partitions_pruned_by_time=2"), "{p}");
    let p = plan("EXPLAIN ANALYZE SELECT time, usage FROM cpu WHERE host = 'host_3'").await;
    for want in [
        "partitions_scanned=3",
        "host TAG_IN [\"host_3\"]",
        "rows_scanned=864",
        "rows_shipped=864",
        "pages_decoded=",
    ] {
        assert!(p.contains(want), "{want} in {p}");
    }
    // A count is pushed down: the node ships one partial state, not rows,
    // and answers it from the directory without decoding a page.
    let p = plan("EXPLAIN ANALYZE SELECT count(*) FROM cpu WHERE host = 'host_3'").await;
    for want in [
        "SealionAggregateExec",
        "partial aggregate calls=[count(*)]",
        "rows_scanned=864",
        "rows_shipped=1",
        "pages_decoded=0",
    ] {
        assert!(p.contains(want), "{want} in {p}");
    }

    let (status, body) = s.http.sql("public", "SELECT count(*) FROM cpu WHERE host = 'host_3' AND time >= '2024-01-02T06:00:00Z' AND time < '2024-01-02T07:00:00Z'").await;
    assert_eq!((status, body["rows"][0][0].as_i64()), (200, Some(12)));

    // Late rows: one replaces a sealed row, one is new; both visible at once.
    let t0 = DAY0_S * 1_000_000_000;
    let (status, _) = s.http.write("public", format!("cpu,host=host_0,region=r0 usage=1000.0,n=1i {t0}\ncpu,host=host_new,region=r9 usage=5.0,n=5i {}\n", t0 + 1)).await;
    assert_eq!(status, 204);
    let v = s
        .http
        .rows(
            "public",
            "SELECT usage FROM cpu WHERE host = 'host_0' AND time = '2024-01-01T00:00:00Z'",
        )
        .await;
    assert_eq!(v, vec![vec![serde_json::json!(1000.0)]]);
    let late = s.http.rows("public", "SELECT late_rows, rows, tag_filter_bytes FROM system.partitions WHERE table_name = 'cpu' ORDER BY start LIMIT 1").await;
    // The late rows withdrew that partition's tag filters (host_new is in
    // no filter): a planner cannot skip it for a host until it is resealed.
    assert_eq!(
        late[0],
        vec![
            serde_json::json!(2),
            serde_json::json!(10 * 288 + 1),
            serde_json::json!(0)
        ]
    );
    let outcomes = admin_seal(&s.http, "cpu").await;
    assert_eq!(
        outcomes.iter().filter(|o| *o == "resealed").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "already_sealed").count(),
        2,
        "{outcomes:?}"
    );
    let late = s.http.rows("public", "SELECT late_rows, rows, tag_filter_bytes FROM system.partitions WHERE table_name = 'cpu' ORDER BY start LIMIT 1").await;
    assert_eq!(
        late[0][..2],
        [serde_json::json!(0), serde_json::json!(10 * 288 + 1)]
    );
    assert!(
        late[0][2].as_u64().unwrap_or(0) > 0,
        "the reseal published filters again: {late:?}"
    );
    let v = s
        .http
        .rows(
            "public",
            "SELECT usage FROM cpu WHERE host = 'host_0' AND time = '2024-01-01T00:00:00Z'",
        )
        .await;
    assert_eq!(v, vec![vec![serde_json::json!(1000.0)]]);

    // Put the model's row back, drop the extra host, and everything still
    // equals the model, before and after a restart.
    let (status, _) = s
        .http
        .write(
            "public",
            format!(
                "cpu,host=host_0,region=r0 usage={}.0,n={}i {t0}\n",
                Dataset::value(0, DAY0_S),
                Dataset::value(0, DAY0_S)
            ),
        )
        .await;
    assert_eq!(status, 204);
    let rows = s
        .http
        .rows(
            "public",
            &format!("SELECT count(*) FROM cpu WHERE host <> 'host_new'"),
        )
        .await;
    assert_eq!(rows[0][0].as_u64().unwrap() as usize, data.rows().len());
    s.proc_.stop();
    s.proc_.restart();
    wait_healthy(&s.http, &mut s.proc_).await;
    let v = s
        .http
        .rows("public", "SELECT usage FROM cpu WHERE host = 'host_new'")
        .await;
    assert_eq!(v, vec![vec![serde_json::json!(5.0)]]);
    let got = per_host_over_http(&s.http, "host <> 'host_new'").await;
    assert_eq!(got, data.per_host());
    let (status, _) = s.http.sql("public", "SELECT 1").await;
    assert_eq!(status, 200);
    let r = s
        .http
        .client
        .post(format!("{}/api/v1/admin/seal?table=nope", s.http.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_whose_time_has_passed_are_sealed_automatically_once_idle() {
    let s =
        start_standalone_with(&["--seal-check-interval-ms", "200", "--seal-idle-ms", "300"]).await;
    let data = Dataset {
        hosts: 4,
        days: 2,
        step_s: 600,
    };
    write_dataset(&s.http, &data, 5_000).await;
    // A partition that has not ended is never sealed.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let (status, _) = s
        .http
        .write(
            "public",
            format!("cpu,host=now,region=r0 usage=1.0,n=1i {now_ns}\n"),
        )
        .await;
    assert_eq!(status, 204);
    eventually("past partitions to be sealed", Duration::from_secs(60), || async {
        let rows = s.http.rows("public", "SELECT count(*) FROM system.partitions WHERE table_name = 'cpu' AND state = 'sealed'").await;
        (rows[0][0] == 2).then_some(())
    })
    .await;
    // The present's partition stays open, and so does the next one, which
    // the write created ahead of the data.
    let open = s
        .http
        .rows(
            "public",
            "SELECT state, start <= now() FROM system.partitions WHERE table_name = 'cpu' AND \"end\" > now() ORDER BY start",
        )
        .await;
    assert_eq!(
        open,
        vec![
            vec![serde_json::json!("open"), serde_json::json!(true)],
            vec![serde_json::json!("open"), serde_json::json!(false)]
        ]
    );
    let got = per_host_over_http(&s.http, "host <> 'now'").await;
    assert_eq!(got, data.per_host());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_by_tags_and_time_is_visible_at_once_on_open_and_sealed_partitions() {
    let s = start_standalone_with(&["--seal-check-interval-ms", "0"]).await;
    let data = Dataset {
        hosts: 5,
        days: 3,
        step_s: 600,
    };
    write_dataset(&s.http, &data, 5_000).await;
    // Seal all three days (their time has passed), then add a late row.
    admin_seal(&s.http, "cpu").await;
    let (status, _) = s
        .http
        .write(
            "public",
            format!(
                "cpu,host=host_9,region=r0 usage=1.0,n=1i {}\n",
                (DAY0_S + 2 * 86_400) * 1_000_000_000
            ),
        )
        .await;
    assert_eq!(status, 204);
    let count = |q: &'static str| {
        let http = &s.http;
        async move { http.rows("public", q).await[0][0].as_i64().unwrap() }
    };
    let total = count("SELECT count(*) FROM cpu").await;
    assert_eq!(total as usize, data.rows().len() + 1);

    // Over pgwire: one host, from the middle of day 1 to the middle of day 3.
    let pg = pg_connect(&s.pg_addr, "public").await;
    let n = pg
        .execute(
            "DELETE FROM cpu WHERE host = 'host_1' AND time >= '2024-01-01T12:00:00Z' AND time < '2024-01-03T12:00:00Z'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 2 * 144, "48 hours of 10-minute rows");
    assert_eq!(
        count("SELECT count(*) FROM cpu WHERE host = 'host_1'").await,
        3 * 144 - 2 * 144
    );
    // Over HTTP, with IN and no time bound.
    let (status, body) = s
        .http
        .sql(
            "public",
            "DELETE FROM cpu WHERE host IN ('host_2', 'host_9')",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows_affected"], 3 * 144 + 1);
    assert_eq!(
        count("SELECT count(*) FROM cpu").await,
        total - 2 * 144 - 3 * 144 - 1
    );
    let parts = s
        .http
        .rows(
            "public",
            "SELECT sum(deleted_rows) FROM system.partitions WHERE table_name = 'cpu'",
        )
        .await;
    assert_eq!(
        parts[0][0],
        2 * 144 + 3 * 144,
        "sealed rows hidden by the two deletes (the late row is gone for good)"
    );

    // A reseal folds the deletes in; the answers stay the same.
    let before = s.http.rows("public", PER_HOST_SQL).await;
    admin_seal(&s.http, "cpu").await;
    assert_eq!(s.http.rows("public", PER_HOST_SQL).await, before);
    let parts = s
        .http
        .rows(
            "public",
            "SELECT sum(deleted_rows) FROM system.partitions WHERE table_name = 'cpu'",
        )
        .await;
    assert_eq!(parts[0][0], 0);

    // Conditions storage cannot apply exactly are refused, and delete nothing.
    let (status, body) = s
        .http
        .sql("public", "DELETE FROM cpu WHERE usage > 50")
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("DELETE condition"),
        "{body}"
    );
    assert_eq!(s.http.rows("public", PER_HOST_SQL).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_sealed_file_is_reported_as_corrupt_never_read_as_values() {
    let s = start_standalone_with(&["--seal-check-interval-ms", "0"]).await;
    let data = Dataset {
        hosts: 3,
        days: 1,
        step_s: 60,
    };
    write_dataset(&s.http, &data, 5_000).await;
    admin_seal(&s.http, "cpu").await;
    let sealed_dir = s._dir.path().join("data").join("storage").join("sealed");
    let file = std::fs::read_dir(&sealed_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Flip a byte in the middle of the data pages.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();
    let (status, body) = s
        .http
        .sql("public", "SELECT sum(usage), sum(n) FROM cpu")
        .await;
    assert!(
        status >= 500,
        "a corrupt page must fail the query: {status} {body}"
    );
    let msg = body["error"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        msg.contains("corrupt") || msg.contains("checksum"),
        "{body}"
    );
    assert!(msg.contains(".slf"), "the error names the file: {body}");
}

/// The value of a counter on the query node's /metrics page (0 if absent).
async fn counter(http: &Http, name: &str) -> f64 {
    let body = http
        .client
        .get(format!("{}/metrics", http.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `req` as a Flight DoGet on a storage node: the batches' row count
/// and the scan counters the node sends after its last batch.
async fn node_scan(
    addr: &str,
    req: &sealion_common::proto::ScanRequest,
) -> (
    Vec<arrow::record_batch::RecordBatch>,
    sealion_common::proto::ScanMetrics,
) {
    use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
    use futures::{StreamExt, TryStreamExt};
    use prost::Message;
    let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let ticket = arrow_flight::Ticket {
        ticket: req.encode_to_vec().into(),
    };
    let stream = client.do_get(ticket).await.unwrap().into_inner();
    let mut decoder = FlightDataDecoder::new(
        stream.map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s))),
    );
    let mut batches = Vec::new();
    let mut metrics = None;
    while let Some(item) = decoder.next().await {
        let item = item.unwrap();
        match &item.payload {
            DecodedPayload::RecordBatch(b) => batches.push(b.clone()),
            DecodedPayload::None => {
                metrics =
                    Some(sealion_common::proto::ScanMetrics::decode(item.app_metadata()).unwrap());
            }
            DecodedPayload::Schema(_) => {}
        }
    }
    (
        batches,
        metrics.expect("the node sends its counters after the last batch"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_nodes_answer_from_sealed_directories_and_count_what_they_read() {
    use sealion_common::proto::{
        AggregateCall, AggregateFunction, AggregateSpec, Column, ColumnKind, DataType, ScanRequest,
        TagOp, TagPredicate,
    };
    let s = start_standalone_with(&["--seal-check-interval-ms", "0"]).await;
    let data = Dataset {
        hosts: 20,
        days: 1,
        step_s: 60,
    };
    write_dataset(&s.http, &data, 5_000).await;
    assert_eq!(admin_seal(&s.http, "cpu").await, vec!["sealed"]);
    let node = s.http.rows("public", "SELECT addr FROM system.nodes").await;
    let addr = node[0][0].as_str().unwrap().to_string();
    let pid = s
        .http
        .rows(
            "public",
            "SELECT partition_id FROM system.partitions WHERE table_name = 'cpu'",
        )
        .await;
    let pid = pid[0][0].as_u64().unwrap();
    let c = |n: &str, k: ColumnKind, t: DataType| Column {
        name: n.into(),
        kind: k as i32,
        data_type: t as i32,
    };
    let columns = vec![
        c("time", ColumnKind::Time, DataType::Timestamp),
        c("host", ColumnKind::Tag, DataType::String),
        c("region", ColumnKind::Tag, DataType::String),
        c("usage", ColumnKind::Field, DataType::Float64),
        c("n", ColumnKind::Field, DataType::Int64),
    ];
    let base = ScanRequest {
        table_id: 0,
        partition_ids: vec![pid],
        start_ns: i64::MIN,
        end_ns: i64::MAX,
        projection: columns.clone(),
        table_columns: columns,
        ..Default::default()
    };

    // The last point of every host comes from the directory: no page read.
    let count =
        |b: &[arrow::record_batch::RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
    let (batches, m) = node_scan(
        &addr,
        &ScanRequest {
            last_per_series: true,
            ..base.clone()
        },
    )
    .await;
    assert_eq!(count(&batches), 20);
    assert_eq!(
        (m.pages_decoded, m.last_points_from_directory),
        (0, 20),
        "{m:?}"
    );
    assert_eq!(m.sealed_partitions_fast, 1);

    // One host's rows: the other hosts' row groups are skipped.
    let one = ScanRequest {
        tag_predicates: vec![TagPredicate {
            column: "host".into(),
            op: TagOp::TagEq as i32,
            values: vec!["host_7".into()],
        }],
        ..base.clone()
    };
    let (batches, m) = node_scan(&addr, &one).await;
    assert_eq!(count(&batches), 1440);
    assert!(m.row_groups_total >= 3, "{m:?}");
    assert!(m.row_groups_skipped >= m.row_groups_total - 2, "{m:?}");
    assert_eq!(m.rows_scanned, 1440, "{m:?}");

    // max(usage) per host: the states' answers, merged per host, equal
    // SQL's over the same rows.
    let agg = ScanRequest {
        projection: vec![],
        aggregate: Some(AggregateSpec {
            bucket_width_ns: 0,
            bucket_origin_ns: 0,
            group_tags: vec!["host".into()],
            calls: vec![AggregateCall {
                function: AggregateFunction::AggMax as i32,
                column: "usage".into(),
            }],
            states_as_answers: true,
        }),
        ..base.clone()
    };
    let (batches, m) = node_scan(&addr, &agg).await;
    assert_eq!(m.rows_matched, 20 * 1440, "{m:?}");
    let mut from_node = std::collections::BTreeMap::new();
    for b in &batches {
        use arrow::array::{Array, StringArray};
        let hosts = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        // Max states travel as their answers: a DOUBLE column.
        assert_eq!(
            b.column(1).data_type(),
            &arrow::datatypes::DataType::Float64
        );
        let states = sealion_format::scan::states::StateColumn::new(
            b.column(1).as_ref(),
            sealion_partial::AggregateKind::Max,
            sealion_partial::ValueType::F64,
        )
        .unwrap();
        for i in 0..b.num_rows() {
            let state = states.state(i).unwrap();
            let Some(sealion_partial::Value::F64(v)) =
                state.finalize(sealion_partial::Finalize::Natural).unwrap()
            else {
                panic!("max without a value");
            };
            assert!(!hosts.is_null(i));
            // A node that read the partition on several threads may send a
            // host's group in more than one row: merged as a query node does.
            from_node
                .entry(hosts.value(i).to_string())
                .and_modify(|m: &mut f64| *m = m.max(v))
                .or_insert(v);
        }
    }
    let from_sql: std::collections::BTreeMap<String, f64> = s
        .http
        .rows("public", "SELECT host, max(usage) FROM cpu GROUP BY host")
        .await
        .into_iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_f64().unwrap()))
        .collect();
    assert_eq!(from_node.len(), 20);
    assert_eq!(from_node, from_sql);
}

/// `INSERT ... VALUES` of literals takes a direct path (no DataFusion
/// plan); `INSERT ... SELECT * FROM (VALUES ...)` is planned by DataFusion.
/// The same literals through both give the same rows, and what the direct
/// path does not take (a mixed column, an expression, a bad value) still
/// gets DataFusion's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_inserts_store_what_datafusion_would() {
    let s = start_standalone().await;
    let pg = pg_connect(&s.pg_addr, "public").await;
    for t in ["direct", "planned"] {
        pg.simple_query(&format!(
            "CREATE TABLE {t} (host TEXT, dc TEXT, temp DOUBLE, n BIGINT, ok BOOLEAN, note TEXT, \
             time TIMESTAMP NOT NULL, PRIMARY KEY (host, dc, time))"
        ))
        .await
        .unwrap();
    }
    // Rows with every literal form: integers and decimals (also negative)
    // for DOUBLE, NULLs, booleans, quotes in text, times with and without
    // an offset or a 'T'.
    let mut rows = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let times = [
        "2024-05-01T10:00:00Z",
        "2024-05-01 10:00:01",
        "2024-05-01T12:00:02+02:00",
        "2024-05-01T10:00:03.250Z",
    ];
    for i in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let temp = match x % 4 {
            0 => format!("{}", (x % 200) as i64 - 100),
            1 => format!("{}.{}", (x % 50) as i64 - 25, x % 10),
            2 => "NULL".into(),
            _ => format!("-{}.5", x % 9),
        };
        let n = if x % 5 == 0 {
            "NULL".into()
        } else {
            format!("{}", (x % 1000) as i64 - 500)
        };
        let ok = ["true", "false", "NULL"][(x % 3) as usize];
        let note = ["'it''s'", "NULL", "'plain'"][(x % 3) as usize];
        let time = times[i % times.len()].replace(":0", &format!(":{:01}", (i / 4) % 6));
        rows.push(format!(
            "('h{}', 'dc{}', {temp}, {n}, {ok}, {note}, '{time}')",
            i % 7,
            i % 2
        ));
    }
    let values = rows.join(", ");
    let cols = "(host, dc, temp, n, ok, note, time)";
    let direct = pg
        .execute(&format!("INSERT INTO direct {cols} VALUES {values}"), &[])
        .await
        .unwrap();
    let planned = pg
        .execute(
            &format!("INSERT INTO planned {cols} SELECT * FROM (VALUES {values})"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(direct, planned);
    // Columns named in another order, and left out (NULL).
    for (t, q) in [
        (
            "direct",
            "INSERT INTO direct (time, note, host) VALUES ('2024-05-02T00:00:00Z', 'x', 'h9')",
        ),
        (
            "planned",
            "INSERT INTO planned (time, note, host) SELECT * FROM (VALUES ('2024-05-02T00:00:00Z', 'x', 'h9'))",
        ),
    ] {
        assert_eq!(pg.execute(q, &[]).await.unwrap(), 1, "{t}");
    }
    let all = |t: &str| {
        format!("SELECT host, dc, temp, n, ok, note, time FROM {t} ORDER BY host, dc, time")
    };
    let a = s.http.rows("public", &all("direct")).await;
    let b = s.http.rows("public", &all("planned")).await;
    assert!(a.len() > 100, "{}", a.len());
    assert_eq!(a, b);

    // What the direct path leaves to DataFusion: a column mixing text and
    // numbers, an expression, a value that does not cast, no time.
    for q in [
        "INSERT INTO direct (host, temp, time) VALUES ('m', 1.5, '2024-05-03T00:00:00Z'), ('m', '2.5', '2024-05-03T00:00:01Z')",
        "INSERT INTO direct (host, temp, time) VALUES ('e', 1 + 1, '2024-05-03T00:00:00Z')",
    ] {
        let n = pg.execute(q, &[]).await.unwrap();
        assert!(n >= 1, "{q}");
    }
    for q in [
        "INSERT INTO direct (host, temp, time) VALUES ('bad', 'warm', '2024-05-03T00:00:00Z')",
        "INSERT INTO direct (host, temp, time) VALUES ('bad', 1.0, 'not a time')",
        "INSERT INTO direct (host, temp, time) VALUES ('bad', 1.0, NULL)",
        "INSERT INTO direct (host, temp) VALUES ('bad', 1.0)",
        "INSERT INTO direct (host, nope, time) VALUES ('bad', 1.0, '2024-05-03T00:00:00Z')",
    ] {
        let e = pg.execute(q, &[]).await.unwrap_err();
        assert!(!e.to_string().is_empty(), "{q}");
    }
    let bad = s
        .http
        .rows("public", "SELECT count(*) FROM direct WHERE host = 'bad'")
        .await;
    assert_eq!(
        bad[0][0].as_i64().unwrap(),
        0,
        "a refused INSERT stores nothing"
    );
    let e = s
        .http
        .rows("public", "SELECT temp FROM direct WHERE host = 'e'")
        .await;
    assert_eq!(e[0][0].as_f64().unwrap(), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_queries_reuse_plans_and_still_see_every_change() {
    let s = start_standalone().await;
    let http = &s.http;
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let (status, body) = http
        .write(
            "public",
            format!(
                "m,host=a v=1.0 {}\nm,host=b v=2.0 {}\n",
                now_ns - 1_000,
                now_ns
            ),
        )
        .await;
    assert_eq!(status, 204, "{body}");

    // The same query twice: the second runs on the first one's plan, the
    // physical plan too.
    let all = "SELECT host, v FROM m ORDER BY host, v";
    let first = http.rows("public", all).await;
    let reused = counter(http, "sealion_query_plans_reused_total").await;
    let physical = counter(http, "sealion_query_physical_plans_reused_total").await;
    let parsed = counter(http, "sealion_query_parses_reused_total").await;
    assert_eq!(http.rows("public", all).await, first);
    assert_eq!(
        counter(http, "sealion_query_parses_reused_total").await,
        parsed + 1.0,
        "the repeated text was not parsed again"
    );
    assert_eq!(
        counter(http, "sealion_query_plans_reused_total").await,
        reused + 1.0,
        "the repeated query reused its plan"
    );
    assert_eq!(
        counter(http, "sealion_query_physical_plans_reused_total").await,
        physical + 1.0,
        "the repeated query reused its physical plan"
    );
    // A row written since into the partition the kept plan reads is in
    // the answer of the kept plan, run once more.
    let (status, body) = http
        .write("public", format!("m,host=a v=1.5 {}\n", now_ns - 500))
        .await;
    assert_eq!(status, 204, "{body}");
    let third = http.rows("public", all).await;
    assert_eq!(third.len(), 3, "{third:?}");
    assert_eq!(third[1][1].as_f64(), Some(1.5), "{third:?}");
    assert_eq!(
        counter(http, "sealion_query_physical_plans_reused_total").await,
        physical + 2.0,
        "the physical plan was reused again"
    );
    // Runs of one kept physical plan at once each get their own copy.
    let together = futures::future::join_all((0..8).map(|_| http.rows("public", all))).await;
    assert!(together.iter().all(|rows| *rows == third), "{together:?}");

    // As Arrow IPC streams: the repeat's stream starts with the schema
    // message kept from the first, and both read back as the JSON answer.
    let arrow_answer = || async {
        let r = http
            .client
            .get(format!("{}/api/v1/sql", http.base))
            .query(&[("db", "public"), ("q", all), ("format", "arrow")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let bytes = r.bytes().await.unwrap();
        let batches: Vec<arrow::record_batch::RecordBatch> =
            arrow::ipc::reader::StreamReader::try_new(&bytes[..], None)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        let mut rows = Vec::new();
        for b in &batches {
            let host = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::StringArray>();
            let v = b
                .column(1)
                .as_any()
                .downcast_ref::<arrow::array::Float64Array>();
            let (host, v) = (host.unwrap(), v.unwrap());
            for i in 0..b.num_rows() {
                rows.push((host.value(i).to_string(), v.value(i)));
            }
        }
        (bytes, rows)
    };
    let (first_bytes, first_rows) = arrow_answer().await;
    let kept_schemas = counter(http, "sealion_query_schema_messages_reused_total").await;
    let (again_bytes, _) = arrow_answer().await;
    assert_eq!(
        counter(http, "sealion_query_schema_messages_reused_total").await,
        kept_schemas + 1.0,
        "the repeat's schema message was the kept one"
    );
    assert_eq!(first_bytes, again_bytes);
    let json: Vec<(String, f64)> = third
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_f64().unwrap()))
        .collect();
    assert_eq!(first_rows, json);

    // A new column changes the catalog: `SELECT *` sees it at once.
    let star = "SELECT * FROM m ORDER BY host";
    let before = http.rows("public", star).await;
    assert_eq!(before[0].len(), 3, "{before:?}");
    let (status, body) = http
        .write("public", format!("m,host=c v=3.0,w=4.0 {now_ns}\n"))
        .await;
    assert_eq!(status, 204, "{body}");
    let after = http.rows("public", star).await;
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(after[0].len(), 4, "the new column w is there: {after:?}");
    assert_eq!(http.rows("public", all).await.len(), 4);

    // `now()` is read per query, never frozen into a kept plan.
    let recent = "SELECT count(*) FROM m WHERE time > now() - interval '3 seconds'";
    let reused = counter(http, "sealion_query_plans_reused_total").await;
    assert_eq!(http.rows("public", recent).await[0][0], 4);
    let wait_until = std::time::UNIX_EPOCH + Duration::from_nanos(now_ns as u64 + 3_500_000_000);
    if let Ok(left) = wait_until.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
    assert_eq!(http.rows("public", recent).await[0][0], 0);
    assert_eq!(
        counter(http, "sealion_query_plans_reused_total").await,
        reused,
        "a query that calls now() is planned every time"
    );

    // System tables show what the catalog version does not cover (node
    // liveness): their plans are never kept.
    for _ in 0..2 {
        http.rows("public", "SELECT node_id, state FROM system.nodes")
            .await;
    }
    assert_eq!(
        counter(http, "sealion_query_plans_reused_total").await,
        reused,
        "a query of a system table is planned every time"
    );
}

/// Drivers speak the extended protocol (Parse, Bind, Execute). A query
/// sent that way is held to the per-query memory limit as one sent over
/// HTTP or the simple protocol is (datafusion-postgres alone ran it on the
/// node's shared context, with no limit), binds its parameters, answers in
/// the binary format tokio-postgres asks for, and runs on a kept plan when
/// it has no parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_queries_keep_the_memory_limit_bind_parameters_and_reuse_plans() {
    let s = start_standalone_with(&["--query-memory-limit-mb", "8"]).await;
    let http = &s.http;
    let t = now_ns();
    let (status, body) = http
        .write(
            "public",
            format!(
                "m,host=a v=1.0 {}\nm,host=a v=2.5 {}\nm,host=b v=4.0 {t}\n",
                t - 2_000,
                t - 1_000
            ),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let pg = pg_connect(&s.pg_addr, "public").await;

    // A hash join's build side of two million keys needs far more than
    // 8 MiB: refused with 53200 however it is sent.
    let join = "SELECT count(*) FROM generate_series(1, 2000000) AS a(x) \
                JOIN generate_series(1, 2000000) AS b(y) ON a.x = b.y";
    let e = pg.simple_query(join).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "53200", "simple protocol: {e}");
    let e = pg.query(join, &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "53200", "extended protocol: {e}");
    let bound = format!("{join} WHERE a.x > $1");
    let e = pg.query(bound.as_str(), &[&0i64]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "53200", "with a parameter: {e}");
    let analyze = format!("EXPLAIN ANALYZE {join}");
    let e = pg.query(analyze.as_str(), &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "53200", "EXPLAIN ANALYZE: {e}");

    // The connection goes on; a parameter is bound and the answer comes
    // back in binary. (No ORDER BY here or below: a sort reserves more
    // than 8 MiB up front, so the rows are put in order here.)
    let rows = pg
        .query("SELECT host, v FROM m WHERE v > $1", &[&2.0f64])
        .await
        .unwrap();
    let mut got: Vec<(String, f64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(got, vec![("a".to_string(), 2.5), ("b".to_string(), 4.0)]);
    let rows = pg
        .query("SELECT count(*) FROM m WHERE host = $1", &[&"a"])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 2);

    // Without parameters the second run takes the first one's plan.
    let q = "SELECT host, count(*) AS n FROM m GROUP BY host";
    let first = pg.query(q, &[]).await.unwrap();
    let reused = counter(http, "sealion_query_plans_reused_total").await;
    let second = pg.query(q, &[]).await.unwrap();
    assert_eq!(
        counter(http, "sealion_query_plans_reused_total").await,
        reused + 1.0,
        "the repeated query reused its plan"
    );
    let pairs = |rows: &[tokio_postgres::Row]| -> Vec<(String, i64)> {
        let mut p: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        p.sort();
        p
    };
    assert_eq!(pairs(&first), vec![("a".into(), 2), ("b".into(), 1)]);
    assert_eq!(pairs(&second), pairs(&first));

    // A new column after the statement was described: the kept plan's
    // columns differ, so the statement's own plan answers.
    let stmt = pg.prepare("SELECT * FROM m").await.unwrap();
    let described = stmt.columns().len();
    let (status, body) = http
        .write("public", format!("m,host=c v=5.0,w=6.0 {}\n", t + 1))
        .await;
    assert_eq!(status, 204, "{body}");
    let rows = pg.query(&stmt, &[]).await.unwrap();
    assert_eq!(rows[0].len(), described, "the columns it was told");
}

/// A query that would run for hours: a trillion generated rows.
const ENDLESS: &str = "SELECT count(*) FROM generate_series(1, 1000000000000)";

/// `--query-timeout-secs` cancels a query still running at the limit, over
/// HTTP and over both PostgreSQL protocols, with SQLSTATE 57014; a
/// session's `SET statement_timeout` cannot lift it; the node goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_the_node_time_limit_is_cancelled() {
    let s = start_standalone_with(&["--query-timeout-secs", "1"]).await;
    let (status, body) = s.http.sql("public", ENDLESS).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["sqlstate"], "57014", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("timeout"),
        "{body}"
    );

    let pg = pg_connect(&s.pg_addr, "public").await;
    let e = pg.simple_query(ENDLESS).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "57014", "simple protocol: {e}");
    let e = pg.query(ENDLESS, &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "57014", "extended protocol: {e}");
    // A longer session limit does not lift the node's.
    pg.simple_query("SET statement_timeout = '1min'")
        .await
        .unwrap();
    let e = pg.query(ENDLESS, &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "57014", "{e}");

    // The node and the connection go on.
    let rows = pg
        .query("SELECT count(*) FROM generate_series(1, 1000)", &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 1000);
    assert_eq!(s.http.rows("public", "SELECT 1").await[0][0], 1);
}

/// A pgwire session's `SET statement_timeout` cancels its own queries
/// (both protocols) well inside the node's limit (300 s by default), and
/// `SET statement_timeout = 0` gives the node's limit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_statement_timeout_cancels_its_queries() {
    let s = start_standalone().await;
    let pg = pg_connect(&s.pg_addr, "public").await;
    pg.simple_query("SET statement_timeout = 300")
        .await
        .unwrap();
    let e = pg.simple_query(ENDLESS).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "57014", "simple protocol: {e}");
    let e = pg.query(ENDLESS, &[]).await.unwrap_err();
    assert_eq!(e.code().unwrap().code(), "57014", "extended protocol: {e}");
    pg.simple_query("SET statement_timeout = 0").await.unwrap();
    let rows = pg
        .query("SELECT count(*) FROM generate_series(1, 1000)", &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 1000);
}

/// Writers that write to one partition at once (with one copy they no
/// longer wait on each other's sync) and a seal among them: every
/// acknowledged row is there, after a kill too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_to_one_partition_lose_nothing_beside_a_seal() {
    let mut s = start_standalone().await;
    // Two days before today: one partition, and one that has ended, so
    // the seal among the writes seals it.
    let base = midnight_days_ago_ns(2);
    const WRITERS: u64 = 6;
    const BATCHES: u64 = 12;
    const ROWS: u64 = 50;
    // Writer w's row i of batch b: host h{w}, its own second, value i.
    let body = move |w: u64, b: u64| -> String {
        (0..ROWS)
            .map(|i| {
                let t = base + ((b * ROWS + i) as i64) * 1_000_000_000;
                format!("cw,host=h{w} v={i}i {t}\n")
            })
            .collect()
    };
    // The table exists before the seal asks for it (writer 0 writes these
    // rows again, with the same values).
    let (status, text) = s.http.write("public", body(0, 0)).await;
    assert_eq!(status, 204, "{text}");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let http = s.http.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..BATCHES {
                let (status, text) = http.write("public", body(w, b)).await;
                assert_eq!(status, 204, "writer {w} batch {b}: {text}");
            }
        }));
    }
    // A seal while the writers run: the rows it does not take stay as
    // late rows.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sealed = admin_seal(&s.http, "cw").await;
    assert_eq!(sealed, vec!["sealed"]);
    for t in tasks {
        t.await.unwrap();
    }
    let want_rows = (WRITERS * BATCHES * ROWS) as i64;
    let want_sum = (WRITERS * BATCHES * (ROWS * (ROWS - 1) / 2)) as i64;
    let check = |rows: Vec<Vec<serde_json::Value>>| {
        assert_eq!(
            (rows[0][0].as_i64().unwrap(), rows[0][1].as_i64().unwrap()),
            (want_rows, want_sum)
        );
        let per_host = rows[0][2].as_i64().unwrap();
        assert_eq!(per_host, WRITERS as i64);
    };
    let q = "SELECT count(*), sum(v), count(DISTINCT host) FROM cw";
    check(s.http.rows("public", q).await);
    s.proc_.kill();
    s.proc_.restart();
    wait_healthy(&s.http, &mut s.proc_).await;
    check(s.http.rows("public", q).await);
    // And after sealing what was left open.
    let sealed = admin_seal(&s.http, "cw").await;
    assert!(
        sealed
            .iter()
            .all(|o| o == "resealed" || o == "already_sealed"),
        "{sealed:?}"
    );
    check(s.http.rows("public", q).await);
}
