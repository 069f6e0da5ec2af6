//! Query planning against a model: every query runs on `sealion standalone`
//! and on DataFusion over an in-memory table of the same rows, and the
//! answers must agree. The data spans sealed partitions (with late rows and
//! a DELETE pending) and an open one, with NULL tags and fields.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use common::*;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use serde_json::Value;

const NS: i64 = 1_000_000_000;
const HOSTS: usize = 6;
const STEP_S: i64 = 430;

#[derive(Clone, Debug)]
struct Row {
    host: usize,
    t_ns: i64,
    usage: Option<f64>,
    n: Option<i64>,
}

fn region(host: usize) -> Option<String> {
    // The last host has no region: a NULL tag.
    (host + 1 < HOSTS).then(|| format!("r{}", host % 3))
}

/// A small deterministic generator (xorshift), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn value_row(rng: &mut Rng, host: usize, t_ns: i64) -> Row {
    let usage = (rng.next() % 10 != 0).then(|| (rng.next() % 1000) as f64 / 10.0);
    // Never both missing: a line needs a field.
    let n = (usage.is_none() || rng.next() % 15 != 0).then(|| (rng.next() % 50) as i64 - 10);
    Row {
        host,
        t_ns,
        usage,
        n,
    }
}

/// Three days of 2024: each host one row about every 430 s, with jitter
/// below 400 s so times stay unique per host.
fn history(rng: &mut Rng) -> Vec<Row> {
    let mut rows = Vec::new();
    for host in 0..HOSTS {
        for k in 0..(3 * 86_400 / STEP_S) {
            let t = (DAY0_S + k * STEP_S + (rng.next() % 400) as i64) * NS;
            rows.push(value_row(rng, host, t));
        }
    }
    rows
}

fn line(r: &Row) -> String {
    let mut tags = format!("cpu,host=h{}", r.host);
    if let Some(reg) = region(r.host) {
        tags.push_str(&format!(",region={reg}"));
    }
    let mut fields = Vec::new();
    if let Some(u) = r.usage {
        fields.push(format!("usage={u:?}"));
    }
    if let Some(n) = r.n {
        fields.push(format!("n={n}i"));
    }
    format!("{tags} {} {}\n", fields.join(","), r.t_ns)
}

async fn write(http: &Http, rows: &[Row]) {
    for chunk in rows.chunks(2_000) {
        let body: String = chunk.iter().map(line).collect();
        let (status, text) = http.write("public", body).await;
        assert_eq!(status, 204, "{text}");
    }
}

/// DataFusion over the same rows, with `time_bucket` as Sealion names it.
async fn model(rows: &[Row]) -> SessionContext {
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("host", DataType::Utf8, true),
        Field::new("region", DataType::Utf8, true),
        Field::new("usage", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(
                TimestampNanosecondArray::from_iter_values(rows.iter().map(|r| r.t_ns))
                    .with_timezone("UTC"),
            ),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| Some(format!("h{}", r.host))),
            )),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| region(r.host)))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.usage))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.n))),
        ],
    )
    .unwrap();
    let ctx = SessionContext::new();
    ctx.register_udf(
        datafusion::functions::datetime::date_bin()
            .as_ref()
            .clone()
            .with_aliases(["time_bucket"]),
    );
    ctx.register_table(
        "cpu",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    ctx
}

async fn model_rows(ctx: &SessionContext, q: &str) -> Vec<Vec<Value>> {
    let batches = ctx.sql(q).await.unwrap().collect().await.unwrap();
    sealion_query::http::json_rows(&batches).unwrap()
}

/// How closely a column must agree with the model.
#[derive(Clone, Copy)]
enum Tol {
    /// Equal; floats to 1e-9 relative (sums may be added in another order).
    Exact,
    /// Within this much, absolute (approximate aggregates).
    Abs(f64),
    /// Within this fraction of the model's value.
    Rel(f64),
}

fn agree(got: &Value, want: &Value, tol: Tol) -> bool {
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            match tol {
                Tol::Exact => a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()),
                Tol::Abs(d) => (a - b).abs() <= d,
                Tol::Rel(r) => (a - b).abs() <= r * b.abs().max(1.0),
            }
        }
        (a, b) => a == b,
    }
}

fn sorted(mut rows: Vec<Vec<Value>>, keys: usize) -> Vec<Vec<Value>> {
    rows.sort_by_key(|r| serde_json::to_string(&r[..keys.min(r.len())]).unwrap());
    rows
}

struct Case {
    sql: &'static str,
    /// The same question in DataFusion's own words, where Sealion's differ.
    model: Option<&'static str>,
    /// Leading columns that identify a row (the group columns).
    keys: usize,
    /// Tolerance per column past the keys; missing ones are `Exact`.
    tol: &'static [Tol],
    pushed: bool,
}

const CASES: &[Case] = &[
    Case {
        sql: "SELECT host, date_bin(INTERVAL '1 hour', time) AS b, max(usage), min(n), count(*), count(usage), sum(n), avg(usage) FROM cpu GROUP BY host, b",
        model: None,
        keys: 2,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT region, stddev(usage), var_pop(n), stddev_pop(usage), var(usage), sum(usage) FROM cpu WHERE time >= '2024-01-01T05:00:00Z' AND time < '2024-01-02T19:30:00Z' GROUP BY region",
        model: None,
        keys: 1,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT count(*), sum(usage), min(time), max(time), max(region) FROM cpu WHERE host = 'h3'",
        model: None,
        keys: 0,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT count(*), count(usage), sum(n), max(usage) FROM cpu WHERE host = 'nobody'",
        model: None,
        keys: 0,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT time_bucket(INTERVAL '15 minutes', time) AS b, host, count(DISTINCT n), min(usage) FROM cpu WHERE usage > 50 AND time BETWEEN '2024-01-02T00:00:00Z' AND '2024-01-02T06:00:00Z' GROUP BY b, host",
        model: None,
        keys: 2,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT host, date_trunc('day', time) AS d, first_value(usage ORDER BY time) IGNORE NULLS, last_value(n ORDER BY time) IGNORE NULLS, first_value(n ORDER BY time DESC) IGNORE NULLS FROM cpu GROUP BY host, d",
        model: None,
        keys: 2,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT date_bin(INTERVAL '1 day', time, TIMESTAMP '2024-01-01T06:00:00Z') AS b, region, count(*), avg(n) FROM cpu WHERE host IN ('h0', 'h1', 'h5') AND region IS NULL OR host = 'h4' GROUP BY b, region",
        model: None,
        keys: 2,
        tol: &[],
        pushed: false,
    },
    Case {
        sql: "SELECT date_bin(INTERVAL '1 day', time, TIMESTAMP '2024-01-01T06:00:00Z') AS b, region, count(*), avg(n) FROM cpu WHERE host NOT IN ('h0', 'h1') AND (usage < 20 OR NOT (n >= 0)) GROUP BY b, region",
        model: None,
        keys: 2,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT region, approx_distinct(n), approx_percentile_cont(0.5) WITHIN GROUP (ORDER BY usage), count(*) FROM cpu WHERE region IS NOT NULL GROUP BY region",
        model: None,
        keys: 1,
        tol: &[Tol::Rel(0.05), Tol::Abs(4.0), Tol::Exact],
        pushed: true,
    },
    Case {
        sql: "SELECT date_trunc('week', time) AS w, max(usage), count(n) FROM cpu GROUP BY w",
        model: None,
        keys: 1,
        tol: &[],
        pushed: true,
    },
    // Shapes the nodes cannot compute exactly run as before: rows shipped,
    // DataFusion aggregates.
    Case {
        sql: "SELECT host, sum(usage * 2), count(*) FROM cpu GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    // Arithmetic over fields of one type in a filter: the nodes evaluate it.
    Case {
        sql: "SELECT host, count(*) FROM cpu WHERE usage + 1 > 50 GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT count(*), sum(n) FROM cpu WHERE usage * 2 - usage > 40.5 AND n * 3 + 1 <= n + 30",
        model: None,
        keys: 0,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT region, count(*) FROM cpu WHERE usage < usage * usage OR n - 4 = 2 GROUP BY region",
        model: None,
        keys: 1,
        tol: &[],
        pushed: true,
    },
    // Fields of two types mixed (a cast), or division: rows are shipped.
    Case {
        sql: "SELECT host, count(*) FROM cpu WHERE usage + n > 50 GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    Case {
        sql: "SELECT host, count(*) FROM cpu WHERE n / 2 > 5 GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    Case {
        sql: "SELECT n, count(*) FROM cpu GROUP BY n",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    Case {
        sql: "SELECT host, first_value(usage ORDER BY time) FROM cpu GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    // A float sum of integers, and distinct floats (DataFusion tells -0.0
    // from 0.0): DataFusion's own arithmetic, not the states'.
    Case {
        sql: "SELECT host, sum(CAST(n AS DOUBLE)), var(n), count(DISTINCT usage) FROM cpu GROUP BY host",
        model: None,
        keys: 1,
        tol: &[],
        pushed: false,
    },
    Case {
        sql: "SELECT host, max(usage) FROM cpu GROUP BY host HAVING max(usage) > 99 ORDER BY host LIMIT 3",
        model: None,
        keys: 1,
        tol: &[],
        pushed: true,
    },
    Case {
        sql: "SELECT host, first(usage, time), last(n, time), last(usage, time), count(*) FROM cpu GROUP BY host",
        model: Some(
            "SELECT host, first_value(usage ORDER BY time) IGNORE NULLS, last_value(n ORDER BY time) IGNORE NULLS, last_value(usage ORDER BY time) IGNORE NULLS, count(*) FROM cpu GROUP BY host",
        ),
        keys: 1,
        tol: &[],
        pushed: true,
    },
    // The same functions where DataFusion runs them (a filter the nodes
    // cannot evaluate).
    Case {
        sql: "SELECT host, first(usage, time), last(n, time) FROM cpu WHERE n % 7 > 2 GROUP BY host",
        model: Some(
            "SELECT host, first_value(usage ORDER BY time) IGNORE NULLS, last_value(n ORDER BY time) IGNORE NULLS FROM cpu WHERE n % 7 > 2 GROUP BY host",
        ),
        keys: 1,
        tol: &[],
        pushed: false,
    },
];

async fn explain(http: &Http, q: &str) -> String {
    explain_with(http, "EXPLAIN", q).await
}

async fn explain_with(http: &Http, how: &str, q: &str) -> String {
    let rows = http.rows("public", &format!("{how} {q}")).await;
    rows.iter()
        .map(|r| {
            format!(
                "{} {}",
                r[0].as_str().unwrap_or(""),
                r[1].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts that `got` has `want`'s rows, key columns equal and the others
/// to the case's tolerance.
fn assert_rows_agree(case: &Case, got: &[Vec<Value>], want: &[Vec<Value>], stage: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{stage}: {}\n got {got:?}\nwant {want:?}",
        case.sql
    );
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{stage}: {}", case.sql);
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let tol = i
                .checked_sub(case.keys)
                .and_then(|k| case.tol.get(k).copied())
                .unwrap_or(Tol::Exact);
            assert!(
                agree(a, b, tol),
                "{stage}: {}\ncolumn {i}: got {a} want {b}\n got row {g:?}\nwant row {w:?}",
                case.sql
            );
        }
    }
}

async fn check_all(http: &Http, ctx: &SessionContext, stage: &str) {
    for case in CASES {
        let got = sorted(http.rows("public", case.sql).await, case.keys);
        // Asked again, the query runs on the plan kept from the first time.
        // (Floats to the case's tolerance: partial states from several
        // streams, or from a node's several scan threads, are merged in the
        // order they arrive, which rounds differently in the last bits.)
        let again = sorted(http.rows("public", case.sql).await, case.keys);
        assert_rows_agree(case, &again, &got, &format!("{stage}: on a reused plan"));
        let want = sorted(
            model_rows(ctx, case.model.unwrap_or(case.sql)).await,
            case.keys,
        );
        assert_rows_agree(case, &got, &want, stage);
        let plan = explain(http, case.sql).await;
        assert_eq!(
            plan.contains("SealionAggregateExec"),
            case.pushed,
            "{stage}: {} pushed down should be {}; plan:\n{plan}",
            case.sql,
            case.pushed
        );
    }
}

/// A filter that passes the nodes' limits only as a set: 24 conjuncts,
/// each a balanced OR of 256 comparisons (511 predicate nodes, 8 levels
/// deep), where only one comparison per conjunct can hold. The rows it
/// keeps are those with `n >= 14`.
fn over_limits_as_a_set() -> String {
    fn tree(leaves: &[String]) -> String {
        match leaves {
            [one] => one.clone(),
            _ => {
                let (l, r) = leaves.split_at(leaves.len() / 2);
                format!("({} OR {})", tree(l), tree(r))
            }
        }
    }
    (0..24)
        .map(|j: i64| {
            let leaves: Vec<String> = (0..256)
                .map(|k| match k {
                    0 => format!("n <> {}", j - 10),
                    k if k % 2 == 0 => format!("usage > {}", 1000 + k),
                    k => format!("n > {}", 1000 + k),
                })
                .collect();
            tree(&leaves)
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Filters nested past what the nodes accept (a sum of many fields, an OR
/// of many comparisons) are left to DataFusion, and conjuncts that pass
/// the nodes' limits only together are applied by the table's own filter
/// above the scan, so the query still answers; nested less, they are
/// pushed as any other. Rows (all of them, and a LIMIT) as well as
/// aggregates.
async fn check_over_limits(http: &Http, ctx: &SessionContext, stage: &str) {
    let sum = |terms: usize| vec!["usage"; terms].join(" + ");
    let any = |terms: usize| {
        (0..terms)
            .map(|i| format!("n = {}", i as i64 - 10))
            .collect::<Vec<_>>()
            .join(" OR ")
    };
    // (filter, aggregate pushed, a field filter sent to the nodes, every
    // conjunct left to the table by DataFusion)
    for (filter, pushed, sent, exact) in [
        (format!("{} > {}", sum(10), 10 * 50), true, true, true),
        (format!("{} > {}", sum(80), 80 * 50), false, false, false),
        (format!("({}) AND usage > 20", any(200)), false, true, false),
        (over_limits_as_a_set(), false, false, true),
    ] {
        let short = &filter[..filter.len().min(80)];
        let sql = format!("SELECT host, count(*), sum(n) FROM cpu WHERE {filter} GROUP BY host");
        let got = sorted(http.rows("public", &sql).await, 1);
        let want = sorted(model_rows(ctx, &sql).await, 1);
        assert!(!want.is_empty(), "{stage}: {short}... selects rows");
        assert_eq!(got, want, "{stage}: {short}...");
        let plan = explain(http, &sql).await;
        assert_eq!(
            plan.contains("SealionAggregateExec"),
            pushed,
            "{stage}: {short}... pushed down should be {pushed}; plan:\n{plan}"
        );
        // Rows, not reading the filtered columns.
        let sql = format!("SELECT time, host FROM cpu WHERE {filter}");
        let got = sorted(http.rows("public", &sql).await, usize::MAX);
        let want = sorted(model_rows(ctx, &sql).await, usize::MAX);
        assert!(
            got == want,
            "{stage}: rows of {short}...: {} against {}",
            got.len(),
            want.len()
        );
        let limited = http.rows("public", &format!("{sql} LIMIT 7")).await;
        assert_eq!(
            limited.len(),
            7.min(want.len()),
            "{stage}: {short}... LIMIT 7"
        );
        assert!(
            limited.iter().all(|r| want.contains(r)),
            "{stage}: {short}... LIMIT 7 gave rows the filter drops: {limited:?}"
        );
        let plan = explain(http, &sql).await;
        let scan = plan.find("SealionScanExec").expect("a scan");
        let scan = &plan[scan..];
        assert_eq!(
            scan[..scan.find('\n').unwrap_or(scan.len())].contains("field filter"),
            sent,
            "{stage}: {short}... field filter sent should be {sent}; plan:\n{plan}"
        );
        assert_eq!(
            plan.contains("FilterExec"),
            !pushed,
            "{stage}: {short}... applied above the scan should be {}; plan:\n{plan}",
            !pushed
        );
        // DataFusion keeps a Filter of its own only for what the table
        // does not apply exactly.
        assert_eq!(
            !plan.contains("Filter: "),
            exact,
            "{stage}: {short}... left to the table should be {exact}; plan:\n{plan}"
        );
    }
}

/// `ORDER BY time LIMIT n` queries: (SQL, pushed down). The first column
/// is the time; rows that tie on it may be any of the tied rows.
const TIME_ORDERED: &[(&str, bool)] = &[
    (
        "SELECT time, host, usage FROM cpu ORDER BY time DESC LIMIT 5",
        true,
    ),
    (
        "SELECT time, host, n FROM cpu WHERE host = 'h1' ORDER BY time DESC LIMIT 20",
        true,
    ),
    (
        "SELECT time, usage FROM cpu WHERE usage > 90 ORDER BY time ASC LIMIT 7",
        true,
    ),
    (
        "SELECT time, host FROM cpu WHERE region IS NULL ORDER BY time DESC LIMIT 3 OFFSET 2",
        true,
    ),
    (
        "SELECT time, host, region FROM cpu WHERE host = 'h2' AND time < '2024-01-03T12:00:00Z' ORDER BY time DESC LIMIT 700",
        true,
    ),
    // LIMIT 1 newest first: from the directories where they can answer.
    (
        "SELECT time, host, usage, n FROM cpu WHERE host = 'h3' ORDER BY time DESC LIMIT 1",
        true,
    ),
    (
        "SELECT time, host, usage FROM cpu WHERE usage < 50 ORDER BY time DESC LIMIT 1",
        true,
    ),
    (
        "SELECT * FROM cpu WHERE host IN ('h1', 'h4') AND time < '2024-01-02T06:00:00Z' ORDER BY time DESC LIMIT 1",
        true,
    ),
    (
        "SELECT time, n FROM cpu WHERE n * 2 > 10 ORDER BY time DESC LIMIT 4",
        true,
    ),
    (
        "SELECT time, n FROM cpu WHERE n % 7 > 2 ORDER BY time DESC LIMIT 4",
        false,
    ),
    (
        "SELECT time, n FROM cpu ORDER BY time DESC, n LIMIT 4",
        false,
    ),
];

/// `ORDER BY <bucket> LIMIT n` over an aggregate: (SQL, limit pushed to
/// the aggregate). Every query's sort keys order its rows completely.
const BUCKET_LIMITED: &[(&str, bool)] = &[
    (
        "SELECT date_bin(INTERVAL '1 hour', time) AS h, max(usage), count(*) FROM cpu GROUP BY h ORDER BY h DESC LIMIT 5",
        true,
    ),
    // Buckets that straddle the daily partitions.
    (
        "SELECT time_bucket(INTERVAL '7 hours', time, '2024-01-01T03:00:00Z') AS b, host, avg(usage) FROM cpu WHERE time < '2024-01-03T06:00:00Z' GROUP BY b, host ORDER BY b DESC, host LIMIT 9",
        true,
    ),
    (
        "SELECT date_bin(INTERVAL '1 day', time) AS d, host, sum(n) FROM cpu WHERE host IN ('h1', 'h2') GROUP BY d, host ORDER BY d, host LIMIT 3",
        true,
    ),
    (
        "SELECT date_trunc('minute', time) AS m, min(n) FROM cpu WHERE usage > 50 GROUP BY m ORDER BY m DESC LIMIT 4 OFFSET 2",
        true,
    ),
    (
        "SELECT date_bin(INTERVAL '1 hour', time) AS h FROM cpu WHERE host = 'h3' GROUP BY h ORDER BY h LIMIT 2",
        true,
    ),
    // More groups than the table has: every partition is read.
    (
        "SELECT date_bin(INTERVAL '1 day', time) AS d, count(*) FROM cpu GROUP BY d ORDER BY d DESC LIMIT 50",
        true,
    ),
    // HAVING drops groups after they are complete: not pushed.
    (
        "SELECT date_bin(INTERVAL '1 hour', time) AS h, count(*) FROM cpu GROUP BY h HAVING count(*) > 30 ORDER BY h DESC LIMIT 3",
        false,
    ),
    // Ordered by an aggregate, not the bucket: not pushed.
    (
        "SELECT date_bin(INTERVAL '1 hour', time) AS h, max(usage) AS top FROM cpu GROUP BY h ORDER BY top DESC, h LIMIT 3",
        false,
    ),
];

async fn check_bucket_limited(http: &Http, ctx: &SessionContext, stage: &str) {
    for (q, pushed) in BUCKET_LIMITED {
        let got = http.rows("public", q).await;
        let want = model_rows(ctx, q).await;
        assert_eq!(
            got.len(),
            want.len(),
            "{stage}: {q}
 got {got:?}
want {want:?}"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g.len() == w.len() && g.iter().zip(w).all(|(a, b)| agree(a, b, Tol::Exact)),
                "{stage}: {q}
 got {got:?}
want {want:?}"
            );
        }
        let plan = explain(http, q).await;
        assert_eq!(
            plan.contains("complete groups"),
            *pushed,
            "{stage}: {q} limit pushed should be {pushed}; plan:\n{plan}"
        );
    }
}

/// The newest rows of each tag group by `row_number()`: (SQL, pushed
/// down). Rows come in no order; they are compared sorted.
const SERIES_LIMITED: &[(&str, bool)] = &[
    (
        "SELECT host, time, usage FROM cpu QUALIFY row_number() OVER (PARTITION BY host ORDER BY time DESC) <= 3",
        true,
    ),
    (
        "SELECT host, time, n FROM (SELECT host, time, n, row_number() OVER (PARTITION BY host ORDER BY time DESC) AS rn FROM cpu WHERE usage > 50) WHERE rn < 3",
        true,
    ),
    // Groups of several series.
    (
        "SELECT region, host, time, usage FROM cpu QUALIFY row_number() OVER (PARTITION BY region ORDER BY time DESC, host) <= 4",
        true,
    ),
    (
        "SELECT time, host FROM cpu WHERE host IN ('h1', 'h4') AND time < '2024-01-02T06:00:00Z' QUALIFY row_number() OVER (PARTITION BY host ORDER BY time DESC) = 1",
        true,
    ),
    (
        "SELECT time, host, n FROM cpu QUALIFY row_number() OVER (ORDER BY time DESC, host) <= 2",
        true,
    ),
    // Oldest first, a bound from below, another function: not pushed.
    (
        "SELECT host, time FROM cpu QUALIFY row_number() OVER (PARTITION BY host ORDER BY time) <= 2",
        false,
    ),
    (
        "SELECT host, time FROM cpu WHERE host = 'h2' QUALIFY row_number() OVER (PARTITION BY host ORDER BY time DESC) > 300",
        false,
    ),
    (
        "SELECT host, time FROM cpu QUALIFY rank() OVER (PARTITION BY host ORDER BY time DESC) <= 2",
        false,
    ),
];

async fn check_series_limited(http: &Http, ctx: &SessionContext, stage: &str) {
    for (q, pushed) in SERIES_LIMITED {
        let got = http.rows("public", q).await;
        let keys = got.first().map_or(0, |r| r.len());
        let (got, want) = (sorted(got, keys), sorted(model_rows(ctx, q).await, keys));
        assert!(!want.is_empty(), "{stage}: {q}: the model has no rows");
        assert_eq!(got, want, "{stage}: {q}");
        let plan = explain(http, q).await;
        assert_eq!(
            plan.contains("of each series"),
            *pushed,
            "{stage}: {q} pushed down should be {pushed}; plan:\n{plan}"
        );
    }
}

/// Last-point queries: (SQL, pushed down).
const LAST_POINT: &[(&str, bool)] = &[
    (
        "SELECT DISTINCT ON (host) host, time, usage, n FROM cpu ORDER BY host, time DESC",
        true,
    ),
    (
        "SELECT DISTINCT ON (host) host, time, usage FROM cpu WHERE host IN ('h1', 'h2', 'h5') AND time < '2024-01-02T12:00:00Z' ORDER BY host, time DESC",
        true,
    ),
    (
        "SELECT host, first_value(usage ORDER BY time DESC), last_value(n ORDER BY time) FROM cpu GROUP BY host ORDER BY host",
        true,
    ),
    // Not the newest row's value: IGNORE NULLS looks further back.
    (
        "SELECT host, first_value(usage ORDER BY time DESC) IGNORE NULLS FROM cpu GROUP BY host ORDER BY host",
        false,
    ),
    (
        "SELECT DISTINCT ON (host) host, time, usage FROM cpu WHERE usage * 2 > 50 ORDER BY host, time DESC",
        true,
    ),
    (
        "SELECT DISTINCT ON (host) host, time, usage FROM cpu WHERE abs(usage) > 50 ORDER BY host, time DESC",
        false,
    ),
];

async fn check_last_point(http: &Http, ctx: &SessionContext, stage: &str) {
    for (q, pushed) in LAST_POINT {
        let got = sorted(http.rows("public", q).await, 1);
        let want = sorted(model_rows(ctx, q).await, 1);
        assert_eq!(got, want, "{stage}: {q}");
        let plan = explain(http, q).await;
        assert_eq!(
            plan.contains("last row of each series"),
            *pushed,
            "{stage}: {q} pushed down should be {pushed}; plan:\n{plan}"
        );
    }
}

async fn check_time_ordered(http: &Http, ctx: &SessionContext, stage: &str) {
    for (q, pushed) in TIME_ORDERED {
        let got = http.rows("public", q).await;
        let want = model_rows(ctx, q).await;
        let times = |rows: &[Vec<Value>]| rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>();
        assert_eq!(times(&got), times(&want), "{stage}: {q}");
        // Every row returned is a row of the table that passes the filter.
        let unlimited = q.split(" ORDER BY").next().unwrap();
        let all = model_rows(ctx, unlimited).await;
        for r in &got {
            assert!(
                all.contains(r),
                "{stage}: {q}: row {r:?} is not in the model"
            );
        }
        let plan = explain(http, q).await;
        assert_eq!(
            plan.contains("SealionRows"),
            *pushed,
            "{stage}: {q} pushed down should be {pushed}; plan:\n{plan}"
        );
        // One process: every step of the scan asks one node, whose rows
        // come in time order, so no sort is planned above the scan (the
        // times compared above are in the model's order).
        if *pushed {
            let physical = plan.split("physical_plan").nth(1).unwrap_or(&plan);
            assert!(
                !physical.contains("SortExec"),
                "{stage}: {q} sorts rows the scan gives in order; plan:\n{plan}"
            );
        }
    }
}

/// `ORDER BY time` with no limit. One host's rows come from the node in
/// time order (one series, partitions of disjoint time ranges) and pass
/// the `SortedRunsExec` unsorted, newest first each batch turned around;
/// several hosts' rows are interleaved in time, each batch holding each
/// host's rows of a partition as a run in time order (about 200 rows a
/// partition), and those batches are sorted there (the runs are not
/// merged: the sort merges fewer streams), on `time` alone or on `time,
/// host`, either way round. Each answers as the model: the same sort keys
/// in the same order, the same rows.
///
/// On a cluster (`counted` false) only the answers and the plan are
/// checked: each node's rows pass or are sorted on their own, so two hosts
/// on two nodes may pass too.
async fn check_sorted_runs(http: &Http, ctx: &SessionContext, stage: &str, counted: bool) {
    // (query, sort keys (leading columns), how its rows are put in order)
    let cases = [
        (
            "SELECT time, usage, n FROM cpu WHERE host = 'h2' ORDER BY time",
            1,
            "pass",
        ),
        (
            "SELECT time, usage FROM cpu WHERE host = 'h3' AND usage > 20 ORDER BY time DESC",
            1,
            "turn",
        ),
        (
            "SELECT time, host, usage FROM cpu WHERE host IN ('h1', 'h4') ORDER BY time",
            1,
            "sort",
        ),
        (
            "SELECT time, host, usage, n FROM cpu ORDER BY time, host",
            2,
            "sort",
        ),
        (
            "SELECT time, host, usage FROM cpu WHERE usage > 50 ORDER BY time DESC, host",
            2,
            "sort",
        ),
    ];
    for (q, keys, how) in cases {
        let got = http.rows("public", q).await;
        let want = model_rows(ctx, q).await;
        let lead =
            |rows: &[Vec<Value>]| rows.iter().map(|r| r[..keys].to_vec()).collect::<Vec<_>>();
        assert_eq!(lead(&got), lead(&want), "{stage}: {q}");
        assert!(!want.is_empty(), "{stage}: {q}: no rows to check");
        assert_eq!(sorted(got, 9), sorted(want, 9), "{stage}: {q}");
        let plan = explain_with(http, "EXPLAIN ANALYZE", q).await;
        assert!(
            plan.contains("SortedRunsExec"),
            "{stage}: {q}; plan:\n{plan}"
        );
        if !counted {
            continue;
        }
        let counts = (
            metric(&plan, "batches_in_order") > 0,
            metric(&plan, "batches_turned") > 0,
            metric(&plan, "runs_merged") > 0,
            metric(&plan, "rows_sorted") > 0,
        );
        let want_counts = match how {
            "pass" => (true, false, false, false),
            "turn" => (true, true, false, false),
            _ => (false, false, false, true),
        };
        assert_eq!(counts, want_counts, "{stage}: {q}; plan:\n{plan}");
    }
}

/// The `name=value` metric of an EXPLAIN ANALYZE text (DataFusion prints
/// large counts as `1.70 K` or `2.26 M`: those are read to three digits).
fn metric(plan: &str, name: &str) -> u64 {
    let at = plan
        .find(&format!("{name}="))
        .unwrap_or_else(|| panic!("no {name} in\n{plan}"));
    let rest = &plan[at + name.len() + 1..];
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let scale = match rest[number.len()..]
        .strip_prefix(' ')
        .and_then(|r| r.chars().next())
    {
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('B') => 1e9,
        _ => 1.0,
    };
    (number.parse::<f64>().unwrap() * scale).round() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_aggregates_answer_as_datafusion_does_over_the_same_rows() {
    let s = start_standalone().await;
    let mut rng = Rng(0x5ea1_1075);
    let mut rows = history(&mut rng);
    write(&s.http, &rows).await;
    let ctx = model(&rows).await;
    check_all(&s.http, &ctx, "open").await;
    check_time_ordered(&s.http, &ctx, "open").await;
    check_sorted_runs(&s.http, &ctx, "open", true).await;
    check_bucket_limited(&s.http, &ctx, "open").await;
    check_series_limited(&s.http, &ctx, "open").await;
    check_last_point(&s.http, &ctx, "open").await;
    check_over_limits(&s.http, &ctx, "open").await;

    // Seal all three days; then late rows for one host and a DELETE for
    // another, both pending on the sealed files; and an open partition.
    let outcomes = admin_seal(&s.http, "cpu").await;
    assert!(outcomes.iter().any(|o| o == "sealed"), "{outcomes:?}");
    let late: Vec<Row> = (0..60)
        .map(|k| {
            let t = (DAY0_S + 86_400 + k * STEP_S + 410) * NS;
            value_row(&mut rng, 1, t)
        })
        .collect();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let recent: Vec<Row> = (0..40)
        .map(|k| value_row(&mut rng, k % HOSTS, now_ns - 3_600 * NS + k as i64 * 7 * NS))
        .collect();
    write(&s.http, &late).await;
    write(&s.http, &recent).await;
    rows.extend(late);
    rows.extend(recent);
    let (from, to) = ((DAY0_S + 86_400) * NS, (DAY0_S + 86_400 + 43_200) * NS);
    let deleted = s
        .http
        .rows(
            "public",
            "DELETE FROM cpu WHERE host = 'h2' AND time >= '2024-01-02T00:00:00Z' AND time < '2024-01-02T12:00:00Z'",
        )
        .await;
    let before = rows.len();
    rows.retain(|r| !(r.host == 2 && r.t_ns >= from && r.t_ns < to));
    assert!(before > rows.len(), "the DELETE covers rows");
    drop(deleted);
    let ctx = model(&rows).await;
    check_all(&s.http, &ctx, "sealed with late rows and a delete").await;
    check_time_ordered(&s.http, &ctx, "sealed with late rows and a delete").await;
    check_sorted_runs(&s.http, &ctx, "sealed with late rows and a delete", true).await;
    check_bucket_limited(&s.http, &ctx, "sealed with late rows and a delete").await;
    check_series_limited(&s.http, &ctx, "sealed with late rows and a delete").await;
    check_last_point(&s.http, &ctx, "sealed with late rows and a delete").await;
    check_over_limits(&s.http, &ctx, "sealed with late rows and a delete").await;
    // With no time range, the newest rows are found in the newest
    // partition that holds rows: older ones are never read. (Meta creates
    // the partition after the current one ahead of the data; it is empty,
    // and read first.)
    let newest = rows.iter().map(|r| r.t_ns).max().unwrap();
    let counts = s
        .http
        .rows(
            "public",
            &format!(
                "SELECT count(DISTINCT partition_id),                  count(DISTINCT partition_id) FILTER (WHERE start > to_timestamp_nanos({newest}))                  FROM system.partitions WHERE table_name = 'cpu'"
            ),
        )
        .await;
    let (total, empty_newer) = (
        counts[0][0].as_u64().unwrap(),
        counts[0][1].as_u64().unwrap(),
    );
    assert!(total >= 4 && empty_newer <= 1, "{counts:?}");
    let q = "SELECT time, host FROM cpu ORDER BY time DESC LIMIT 5";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "partitions_total"), total, "{plan}");
    assert_eq!(metric(&plan, "partitions_read"), 1 + empty_newer, "{plan}");
    // Oldest first reads the first day's partition alone.
    let q = "SELECT time, host FROM cpu WHERE host = 'h0' ORDER BY time LIMIT 5";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "partitions_read"), 1, "{plan}");
    // The newest hours of the sealed days are all in the last day's
    // partition: the aggregate reads it alone. Oldest first, the first.
    let q = "SELECT date_bin(INTERVAL '1 hour', time) AS h, max(usage) FROM cpu WHERE time < '2024-01-04T00:00:00Z' GROUP BY h ORDER BY h DESC LIMIT 5";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "partitions_read"), 1, "{plan}");
    assert_eq!(metric(&plan, "partitions_scanned"), 3, "{plan}");
    let q = "SELECT date_bin(INTERVAL '1 hour', time) AS h, host, count(*) FROM cpu GROUP BY h, host ORDER BY h, host LIMIT 20";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "partitions_read"), 1, "{plan}");

    // A reseal folds both in.
    admin_seal(&s.http, "cpu").await;
    check_all(&s.http, &ctx, "resealed").await;
    check_time_ordered(&s.http, &ctx, "resealed").await;
    check_sorted_runs(&s.http, &ctx, "resealed", true).await;
    check_bucket_limited(&s.http, &ctx, "resealed").await;
    check_series_limited(&s.http, &ctx, "resealed").await;
    check_last_point(&s.http, &ctx, "resealed").await;
    // Sealed and clean: the last points come from the directories, no page
    // decoded, one row per series shipped.
    let q = "SELECT DISTINCT ON (host) host, time, usage FROM cpu WHERE time < '2024-01-04T00:00:00Z' ORDER BY host, time DESC";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "pages_decoded"), 0, "{plan}");
    assert_eq!(metric(&plan, "rows_shipped"), HOSTS as u64, "{plan}");
    // Bytes shipped are the rows' values (host, time, usage: a few dozen
    // bytes each), not the capacity the node's builders reserved.
    let bytes = metric(&plan, "bytes_shipped");
    assert!(bytes > 0 && bytes <= 100 * HOSTS as u64, "{plan}");
    // One host's newest row: from the directory of the newest partition
    // that holds the host, no page decoded.
    let q = "SELECT * FROM cpu WHERE host = 'h3' ORDER BY time DESC LIMIT 1";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    assert_eq!(metric(&plan, "pages_decoded"), 0, "{plan}");
    assert_eq!(metric(&plan, "rows_shipped"), 1, "{plan}");
    // The newest three rows of each host: at most three per series from
    // each partition read.
    let q = "SELECT host, time, usage FROM cpu WHERE time < '2024-01-04T00:00:00Z' QUALIFY row_number() OVER (PARTITION BY host ORDER BY time DESC) <= 3";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    let read = metric(&plan, "partitions_read");
    assert!(read >= 1, "{plan}");
    assert!(
        metric(&plan, "rows_shipped") <= 3 * HOSTS as u64 * read,
        "{plan}"
    );
    // Over a node's group limits (65,536 sketches: 20 sketches for each
    // host's minutes), the query node aggregates the rows itself and
    // answers as DataFusion does (over the same rows in another order: to
    // the last bits).
    let qs: Vec<String> = (1..=20)
        .map(|i| {
            format!(
                "approx_percentile_cont({}) WITHIN GROUP (ORDER BY usage)",
                i as f64 / 21.0
            )
        })
        .collect();
    let q = format!(
        "SELECT host, date_bin(INTERVAL '1 minute', time) AS m, {} FROM cpu GROUP BY host, m",
        qs.join(", ")
    );
    let got = sorted(s.http.rows("public", &q).await, 2);
    let want = sorted(model_rows(&ctx, &q).await, 2);
    assert!(got.len() * 20 > 65_536, "{} groups", got.len());
    assert_eq!(got.len(), want.len());
    let same = |a: &[Value], b: &[Value]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| agree(x, y, Tol::Exact))
    };
    if let Some(i) = (0..got.len()).find(|&i| !same(&got[i], &want[i])) {
        panic!("{q}\nrow {i}: got {:?}\nwant {:?}", got[i], want[i]);
    }
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", &q).await;
    assert_eq!(metric(&plan, "groups_over_node_limit"), 1, "{plan}");
    // A pushed aggregate ships one state per group from each thread the
    // node's scan ran on, whatever the rows. (The sealed files are shared
    // out over threads when they hold enough row groups: with the open
    // rows of the last hour sealed too, just after midnight, they do.)
    let q = "SELECT host, count(*), max(usage) FROM cpu GROUP BY host";
    let plan = explain_with(&s.http, "EXPLAIN ANALYZE", q).await;
    // (Printed to three digits.)
    let scanned = metric(&plan, "rows_scanned");
    assert!(scanned * 100 >= rows.len() as u64 * 99, "{plan}");
    let threads = metric(&plan, "scan_threads");
    assert!(threads >= 1, "{plan}");
    let shipped = metric(&plan, "rows_shipped");
    assert!(
        shipped >= HOSTS as u64 && shipped <= threads * HOSTS as u64,
        "{plan}"
    );
    assert!(metric(&plan, "bytes_shipped") <= 200 * shipped, "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_its_memory_limit_fails_alone_and_the_node_goes_on() {
    let s = start_standalone_with(&["--query-memory-limit-mb", "8"]).await;
    let mut rng = Rng(7);
    let rows = history(&mut rng);
    write(&s.http, &rows).await;
    // A hash join's build side cannot spill: two million keys need far more
    // than 8 MiB.
    let (status, body) = s
        .http
        .sql(
            "public",
            "SELECT count(*) FROM generate_series(1, 2000000) AS a(x) JOIN generate_series(1, 2000000) AS b(y) ON a.x = b.y",
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["sqlstate"], "53200", "{body}");
    let text = body["error"].as_str().unwrap();
    assert!(text.contains("memory"), "{text}");
    // The node is up and answers the next query.
    let rows_back = s.http.rows("public", "SELECT count(*) FROM cpu").await;
    assert_eq!(rows_back[0][0], serde_json::json!(rows.len()));
    // A pushed aggregate counts its merge against the same pool.
    let rows_back = s
        .http
        .rows("public", "SELECT host, count(*) FROM cpu GROUP BY host")
        .await;
    assert_eq!(rows_back.len(), HOSTS);
}

/// One random aggregate query from a small grammar of what pushdown
/// handles (and some of what it does not): (Sealion's SQL, DataFusion's
/// SQL, number of group columns).
/// One conjunct of the random grammar: time bounds, tag predicates and
/// field comparisons the nodes apply exactly, and one shape only
/// DataFusion evaluates.
fn random_filter(rng: &mut Rng) -> String {
    let pick = |rng: &mut Rng, n: usize| (rng.next() % n as u64) as usize;
    let h = pick(rng, HOSTS + 1);
    let v = pick(rng, 100);
    match pick(rng, 15) {
        0 => format!(
            "time >= '2024-01-0{}T{:02}:00:00Z'",
            1 + pick(rng, 3),
            pick(rng, 24)
        ),
        1 => format!(
            "time < '2024-01-0{}T{:02}:00:00Z'",
            1 + pick(rng, 3),
            pick(rng, 24)
        ),
        2 => format!(
            "time BETWEEN '2024-01-01T{:02}:00:00Z' AND '2024-01-03T{:02}:30:00Z'",
            pick(rng, 24),
            pick(rng, 24)
        ),
        3 => format!("host = 'h{h}'"),
        4 => format!("host IN ('h{h}', 'h{}', 'nobody')", (h + 2) % HOSTS),
        5 => format!("host != 'h{h}'"),
        6 => "region IS NULL".into(),
        7 => "region IS NOT NULL".into(),
        8 => format!("usage > {v}"),
        9 => format!("n <= {}", v / 2),
        10 => format!("(usage < {v} OR n > {})", v / 3),
        11 => format!("NOT (n = {})", v % 40),
        12 => format!("usage + usage * 0.5 - 1 > {}", v + 20),
        13 => format!("n * 2 - 3 > {}", v / 2),
        // Not something the nodes evaluate: rows are shipped.
        _ => format!("n % 7 > {}", v % 7),
    }
}

fn random_query(rng: &mut Rng) -> (String, String, usize) {
    let pick = |rng: &mut Rng, n: usize| (rng.next() % n as u64) as usize;
    let mut groups: Vec<String> = Vec::new();
    for tag in ["host", "region"] {
        if rng.next() % 2 == 0 {
            groups.push(tag.into());
        }
    }
    if rng.next() % 3 != 0 {
        let bucket = match pick(rng, 5) {
            0 => format!("date_bin(INTERVAL '{} minutes', time)", 1 + pick(rng, 90)),
            1 => format!(
                "date_bin(INTERVAL '{} hours', time, TIMESTAMP '2024-01-01T00:{:02}:00Z')",
                1 + pick(rng, 12),
                pick(rng, 60)
            ),
            2 => format!("time_bucket(INTERVAL '{} hours', time)", 1 + pick(rng, 30)),
            3 => "date_trunc('hour', time)".to_string(),
            _ => "date_trunc('day', time)".to_string(),
        };
        let at = pick(rng, groups.len() + 1);
        groups.insert(at, bucket);
    }
    let by_host = groups.iter().any(|g| g == "host");
    let mut calls: Vec<(String, String)> = Vec::new();
    for _ in 0..1 + pick(rng, 4) {
        let same = |s: &str| (s.to_string(), s.to_string());
        let call = match pick(rng, 15) {
            0 => same("count(*)"),
            1 => same("count(usage)"),
            2 => same("sum(n)"),
            3 => same("sum(usage)"),
            4 => same("min(usage)"),
            5 => same("max(n)"),
            6 => same("avg(usage)"),
            7 => same("avg(n)"),
            8 => same("stddev(usage)"),
            9 => same("var_pop(n)"),
            10 => same("count(DISTINCT n)"),
            11 => same("min(time)"),
            12 => same("max(region)"),
            // Ties on time only within one host's rows cannot happen, so
            // first/last are asked per host.
            13 if by_host => (
                "first(usage, time)".into(),
                "first_value(usage ORDER BY time) IGNORE NULLS".into(),
            ),
            14 if by_host => (
                "last(n, time)".into(),
                "last_value(n ORDER BY time) IGNORE NULLS".into(),
            ),
            _ => same("count(n)"),
        };
        calls.push(call);
    }
    let filters: Vec<String> = (0..pick(rng, 4)).map(|_| random_filter(rng)).collect();
    let select = |calls: Vec<&String>| {
        let mut cols: Vec<String> = groups.clone();
        cols.extend(
            calls
                .into_iter()
                .enumerate()
                .map(|(i, c)| format!("{c} AS a{i}")),
        );
        let mut q = format!("SELECT {} FROM cpu", cols.join(", "));
        if !filters.is_empty() {
            q.push_str(&format!(" WHERE {}", filters.join(" AND ")));
        }
        if !groups.is_empty() {
            let by: Vec<String> = (1..=groups.len()).map(|i| i.to_string()).collect();
            q.push_str(&format!(" GROUP BY {}", by.join(", ")));
        }
        q
    };
    (
        select(calls.iter().map(|c| &c.0).collect()),
        select(calls.iter().map(|c| &c.1).collect()),
        groups.len(),
    )
}

async fn check_random(http: &Http, ctx: &SessionContext, seed: u64, count: usize, stage: &str) {
    let mut rng = Rng(seed);
    let mut pushed = 0;
    for i in 0..count {
        let (sql, model_sql, keys) = random_query(&mut rng);
        let got = sorted(http.rows("public", &sql).await, keys);
        let want = sorted(model_rows(ctx, &model_sql).await, keys);
        let context = format!("{stage}, seed {seed:#x}, query {i}: {sql}");
        assert_eq!(
            got.len(),
            want.len(),
            "{context}\n got {got:?}\nwant {want:?}"
        );
        for (g, w) in got.iter().zip(&want) {
            for (a, b) in g.iter().zip(w) {
                assert!(agree(a, b, Tol::Exact), "{context}\n got {g:?}\nwant {w:?}");
            }
        }
        if explain(http, &sql).await.contains("SealionAggregateExec") {
            pushed += 1;
        }
    }
    // The grammar is mostly of pushable shapes: most must have been pushed.
    assert!(
        pushed * 2 > count,
        "{stage}: only {pushed} of {count} pushed down"
    );
}

/// How a random row query's answer is compared with the model's.
enum RowForm {
    /// No order, no limit: the same rows, in any order.
    All,
    /// `ORDER BY time DESC, host LIMIT k`: a total order, the same list.
    Ordered,
    /// `ORDER BY time DESC LIMIT k` (what the time-order pushdown takes):
    /// the same times in the same order, each row one the model has.
    TimeOrdered,
    /// `LIMIT k` alone: as many rows as the model gives up to `k`, each
    /// one the model has.
    Limited(usize),
}

/// Whether the nodes apply `filter` (from [`random_filter`]) to every row
/// they send, so that DataFusion does not apply it again: all but the
/// remainder, which the nodes do not evaluate.
fn applied_by_nodes(filter: &str) -> bool {
    !filter.starts_with("n %")
}

/// A row query: some of the columns (not always those the filters name)
/// under random filters, in one of the [`RowForm`]s. Also the query
/// without its order and limit, and the filters.
fn random_row_query(rng: &mut Rng) -> (String, String, RowForm, Vec<String>) {
    let pick = |rng: &mut Rng, n: usize| (rng.next() % n as u64) as usize;
    let mut cols: Vec<&str> = ["time", "host", "region", "usage", "n"]
        .into_iter()
        .filter(|_| rng.next() % 2 == 0)
        .collect();
    if cols.is_empty() {
        cols.push("usage");
    }
    let form = match pick(rng, 4) {
        0 => RowForm::All,
        1 => RowForm::Ordered,
        2 => {
            cols.retain(|c| *c != "time");
            cols.insert(0, "time");
            RowForm::TimeOrdered
        }
        _ => RowForm::Limited(1 + pick(rng, 200)),
    };
    let filters: Vec<String> = (0..1 + pick(rng, 3)).map(|_| random_filter(rng)).collect();
    let all = format!(
        "SELECT {} FROM cpu WHERE {}",
        cols.join(", "),
        filters.join(" AND ")
    );
    let k = 1 + pick(rng, 60);
    let sql = match form {
        RowForm::All => all.clone(),
        RowForm::Ordered => format!("{all} ORDER BY time DESC, host LIMIT {k}"),
        RowForm::TimeOrdered => format!("{all} ORDER BY time DESC LIMIT {k}"),
        RowForm::Limited(k) => format!("{all} LIMIT {k}"),
    };
    (sql, all, form, filters)
}

/// Random row queries answer as the model does; those whose every filter
/// is one the nodes evaluate run with no filter above the scan, and the
/// others keep one.
async fn check_random_rows(
    http: &Http,
    ctx: &SessionContext,
    seed: u64,
    count: usize,
    stage: &str,
) {
    let mut rng = Rng(seed);
    let mut unfiltered = 0;
    for i in 0..count {
        let (sql, all, form, filters) = random_row_query(&mut rng);
        let context = format!("{stage}, seed {seed:#x}, row query {i}: {sql}");
        let got = http.rows("public", &sql).await;
        let everything = sorted(model_rows(ctx, &all).await, usize::MAX);
        let known: std::collections::HashSet<String> = everything
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        let has = |row: &Vec<Value>| known.contains(&serde_json::to_string(row).unwrap());
        match form {
            RowForm::All => {
                let got = sorted(got, usize::MAX);
                assert_eq!(got.len(), everything.len(), "{context}: rows");
                assert!(got == everything, "{context}: the same count, other rows");
            }
            RowForm::Ordered => {
                assert_eq!(got, model_rows(ctx, &sql).await, "{context}");
            }
            RowForm::TimeOrdered => {
                let times =
                    |rows: &[Vec<Value>]| rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>();
                let want = model_rows(ctx, &sql).await;
                assert_eq!(times(&got), times(&want), "{context}");
                assert!(got.iter().all(has), "{context}\n got {got:?}");
            }
            RowForm::Limited(k) => {
                assert_eq!(got.len(), k.min(everything.len()), "{context}");
                assert!(got.iter().all(has), "{context}\n got {got:?}");
            }
        }
        let plan = explain(http, &sql).await;
        // A contradiction (`host = 'a' AND host = 'b'`) is folded by
        // DataFusion into an empty plan with no scan and no filter at all
        // (seen: SEALION_SEED=18eed16a7d26e9e3).
        if !plan.contains("SealionScanExec") {
            assert!(
                plan.contains("EmptyExec"),
                "{context}: no scan; plan:\n{plan}"
            );
            continue;
        }
        let by_nodes = filters.iter().all(|f| applied_by_nodes(f));
        unfiltered += usize::from(by_nodes);
        assert_eq!(
            !plan.contains("FilterExec"),
            by_nodes,
            "{context}: the nodes apply every filter: {by_nodes}; plan:\n{plan}"
        );
    }
    assert!(
        unfiltered > 0,
        "{stage}: none of {count} queries had only filters the nodes apply"
    );
}

/// Tag, time and field filters are left to the nodes, which then send
/// only the columns the query reads; a filter they do not evaluate is
/// applied above the scan, which then ships its column too.
async fn check_exact_filters(http: &Http, stage: &str) {
    // The columns the scan's nodes send, in the plan's order.
    let columns = |plan: &str| -> Vec<String> {
        let at = plan.find("columns=[").expect("a scan") + "columns=[".len();
        let end = at + plan[at..].find(']').unwrap();
        plan[at..end].split(',').map(str::to_string).collect()
    };
    let q = "SELECT time, usage FROM cpu WHERE host = 'h1' AND time >= '2024-01-02T00:00:00Z'";
    let plan = explain(http, q).await;
    assert!(!plan.contains("FilterExec"), "{stage}: {q}\n{plan}");
    assert_eq!(columns(&plan), ["time", "usage"], "{stage}: {q}\n{plan}");
    let q = "SELECT time, n FROM cpu WHERE host = 'h1' AND usage > 50";
    let plan = explain(http, q).await;
    assert!(!plan.contains("FilterExec"), "{stage}: {q}\n{plan}");
    assert_eq!(columns(&plan), ["time", "n"], "{stage}: {q}\n{plan}");
    let q = "SELECT time, usage FROM cpu WHERE host = 'h1' AND n % 7 > 2";
    let plan = explain(http, q).await;
    assert!(plan.contains("FilterExec"), "{stage}: {q}\n{plan}");
    // The scan sends them in the table's order, which is the order the
    // first written row named its fields in (`usage` may be missing from
    // it, by the seed), so compare them as a set.
    let mut sent = columns(&plan);
    sent.sort();
    assert_eq!(sent, ["n", "time", "usage"], "{stage}: {q}\n{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_aggregates_on_a_cluster_answer_as_datafusion_does() {
    let seed = std::env::var("SEALION_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("seed {seed:#x} (SEALION_SEED={seed:x} repeats it)");
    let cluster = start_cluster(3).await;
    let http = &cluster.http;
    let mut rng = Rng(seed);
    let mut rows = history(&mut rng);
    write(http, &rows).await;
    let ctx = model(&rows).await;
    check_random(http, &ctx, seed, 40, "open").await;
    check_random_rows(http, &ctx, seed, 30, "open").await;
    check_exact_filters(http, "open").await;
    check_bucket_limited(http, &ctx, "cluster, open").await;
    check_series_limited(http, &ctx, "cluster, open").await;
    check_sorted_runs(http, &ctx, "cluster, open", false).await;
    admin_seal(http, "cpu").await;
    let late: Vec<Row> = (0..50)
        .map(|k| value_row(&mut rng, 3, (DAY0_S + k * STEP_S + 405) * NS))
        .collect();
    write(http, &late).await;
    rows.extend(late);
    http.rows(
        "public",
        "DELETE FROM cpu WHERE host = 'h4' AND time >= '2024-01-02T00:00:00Z'",
    )
    .await;
    rows.retain(|r| !(r.host == 4 && r.t_ns >= (DAY0_S + 86_400) * NS));
    let ctx = model(&rows).await;
    check_random(http, &ctx, seed ^ 0x9e37, 60, "sealed, late rows, delete").await;
    check_random_rows(http, &ctx, seed ^ 0x7f4a, 40, "sealed, late rows, delete").await;
    check_exact_filters(http, "sealed").await;
    check_bucket_limited(http, &ctx, "cluster, sealed").await;
    check_series_limited(http, &ctx, "cluster, sealed").await;
    check_sorted_runs(http, &ctx, "cluster, sealed", false).await;
    check_over_limits(http, &ctx, "cluster, sealed").await;
    drop(cluster);
}

/// Trades for the as-of join: unique times per host, some before any
/// reading, some for a host with no readings.
fn trades(rng: &mut Rng, count: usize) -> Vec<(usize, i64, f64)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    while out.len() < count {
        let host = (rng.next() % (HOSTS as u64 + 1)) as usize;
        let t = (DAY0_S - 600 + (rng.next() % (3 * 86_400 + 1_200)) as i64) * NS;
        if seen.insert((host, t)) {
            out.push((host, t, (rng.next() % 1000) as f64));
        }
    }
    out
}

async fn model_with_trades(rows: &[Row], trades: &[(usize, i64, f64)]) -> SessionContext {
    let ctx = model(rows).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("host", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(
                TimestampNanosecondArray::from_iter_values(trades.iter().map(|t| t.1))
                    .with_timezone("UTC"),
            ),
            Arc::new(StringArray::from_iter(
                trades.iter().map(|t| Some(format!("h{}", t.0))),
            )),
            Arc::new(Float64Array::from_iter_values(trades.iter().map(|t| t.2))),
        ],
    )
    .unwrap();
    ctx.register_table(
        "trades",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asof_join_answers_as_a_window_function_model_by_probe_and_by_merge() {
    let s = start_standalone().await;
    let mut rng = Rng(0xa50f);
    let rows = history(&mut rng);
    write(&s.http, &rows).await;
    admin_seal(&s.http, "cpu").await;
    let sealion_sql = "SELECT host, time, price, cpu_usage, cpu_n, cpu_time FROM asof_join('trades', 'cpu', 'host')";
    let model_sql = "WITH j AS (SELECT t.host, t.time, t.price, c.usage, c.n, c.time AS ctime, \
        row_number() OVER (PARTITION BY t.host, t.time ORDER BY c.time DESC) AS rn \
        FROM trades t LEFT JOIN cpu c ON c.host = t.host AND c.time <= t.time) \
        SELECT host, time, price, usage AS cpu_usage, n AS cpu_n, ctime AS cpu_time FROM j WHERE rn = 1";
    // A few hundred trades: the right side is read for their hosts only.
    // Then more trades than the probe limit: one merge of both sides.
    let mut all = Vec::new();
    for (count, probe) in [(300usize, 1u64), (12_000, 0)] {
        let batch = trades(&mut rng, count);
        let body: String = batch
            .iter()
            .filter(|t| {
                !all.iter()
                    .any(|a: &(usize, i64, f64)| a.0 == t.0 && a.1 == t.1)
            })
            .map(|(h, t, p)| format!("trades,host=h{h} price={p:?} {t}\n"))
            .collect();
        let (status, text) = s.http.write("public", body).await;
        assert_eq!(status, 204, "{text}");
        for t in batch {
            if !all
                .iter()
                .any(|a: &(usize, i64, f64)| a.0 == t.0 && a.1 == t.1)
            {
                all.push(t);
            }
        }
        let ctx = model_with_trades(&rows, &all).await;
        for filter in [
            "",
            " WHERE host IN ('h1', 'h6') AND time >= '2024-01-02T00:00:00Z'",
        ] {
            let q = format!("{sealion_sql}{filter}");
            let m = format!("{model_sql}{}", filter.replace(" WHERE ", " AND "));
            let got = sorted(s.http.rows("public", &q).await, 2);
            let want = sorted(model_rows(&ctx, &m).await, 2);
            assert_eq!(got.len(), want.len(), "{q}");
            assert_eq!(got, want, "{q}");
        }
        let plan = explain_with(&s.http, "EXPLAIN ANALYZE", sealion_sql).await;
        assert_eq!(metric(&plan, "probe_regime"), probe, "{plan}");
    }
}
