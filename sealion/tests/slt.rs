//! SQL behaviour in sqllogictest files (`tests/slt/*.slt`), run over the
//! PostgreSQL protocol against `sealion standalone` and against a cluster
//! of processes with three storage nodes. Each file runs in a database of
//! its own.
//!
//! The files may use, with `control substitution on`:
//! - `$HTTP`: the query node's HTTP address, and `$DB`: the file's
//!   database, e.g. to seal a table from a `system ok` record:
//!   `curl -sf -X POST "http://$HTTP/api/v1/admin/seal?db=$DB&table=cpu"`.
//!
//! `SEALION_SLT=name` runs only the files whose name contains `name`.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use sqllogictest::{DBOutput, DefaultColumnType};
use tokio_postgres::SimpleQueryMessage;

struct Pg {
    client: tokio_postgres::Client,
}

/// A server error with its message (tokio-postgres prints only "db error").
#[derive(Debug)]
struct PgError {
    sqlstate: Option<String>,
    message: String,
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PgError {}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        PgError {
            sqlstate: e.code().map(|c| c.code().to_string()),
            message: e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_string()),
        }
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for Pg {
    type Error = PgError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Self::Error> {
        let mut rows = Vec::new();
        let mut columns = None;
        let mut affected = 0;
        for m in self.client.simple_query(sql).await? {
            match m {
                SimpleQueryMessage::RowDescription(cols) => columns = Some(cols.len()),
                SimpleQueryMessage::Row(r) => rows.push(
                    (0..r.len())
                        .map(|i| match r.get(i) {
                            None => "NULL".to_string(),
                            Some("") => "(empty)".to_string(),
                            Some(s) => s.to_string(),
                        })
                        .collect(),
                ),
                SimpleQueryMessage::CommandComplete(n) => affected = n,
                _ => {}
            }
        }
        Ok(match columns {
            Some(n) => DBOutput::Rows {
                types: vec![DefaultColumnType::Any; n],
                rows,
            },
            None => DBOutput::StatementComplete(affected),
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "sealion"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await
    }

    fn error_sql_state(err: &Self::Error) -> Option<String> {
        err.sqlstate.clone()
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    let only = std::env::var("SEALION_SLT").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(&only))
        .collect();
    files.sort();
    assert!(
        !files.is_empty() || !only.is_empty(),
        "no .slt files in {}",
        dir.display()
    );
    files
}

/// Runs every file against the server at `http_addr` / `pg_addr`.
async fn run_all(http: &Http, http_addr: &str, pg_addr: &str, target: &str) {
    let mut failures = Vec::new();
    for file in slt_files() {
        let stem = file
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('-', "_");
        let db = format!("slt_{stem}");
        let (status, body) = http.sql("public", &format!("CREATE DATABASE {db}")).await;
        assert_eq!(status, 200, "{body}");
        let pg = pg_addr.to_string();
        let db_for_conn = db.clone();
        let mut runner = sqllogictest::Runner::new(move || {
            let pg = pg.clone();
            let db = db_for_conn.clone();
            async move {
                let client = pg_connect(&pg, &db).await;
                Ok::<_, PgError>(Pg { client })
            }
        });
        runner.add_label(target);
        runner.set_var("HTTP".into(), http_addr.to_string());
        runner.set_var("DB".into(), db.clone());
        if let Err(e) = runner.run_file_async(&file).await {
            failures.push(format!("{target}: {}\n{e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slt_files_pass_against_standalone() {
    let s = start_standalone().await;
    let http_addr = s.http.base.trim_start_matches("http://").to_string();
    run_all(&s.http, &http_addr, &s.pg_addr, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slt_files_pass_against_a_cluster_with_three_storage_nodes() {
    let c = start_cluster(3).await;
    run_all(&c.http, &c.http_addr, &c.pg_addr, "cluster").await;
}
