//! Starting and stopping a query node: connect to meta, then serve HTTP and
//! the PostgreSQL protocol until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sealion_common::meta_client::MetaClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::catalog::Shared;
use crate::pg::PgHandlers;
use crate::router::{StorageClients, WriteRouter};
use crate::sql::SqlEngine;
use crate::{Error, QueryContext, Result};
use sealion_common::local::LocalStorage;

#[derive(Debug, Clone)]
pub struct QueryConfig {
    pub http_addr: SocketAddr,
    pub pg_addr: SocketAddr,
    pub meta_addrs: Vec<String>,
    /// Most PostgreSQL connections served at once.
    pub pg_max_connections: usize,
    /// Most bytes one query's operators may reserve (0: no limit).
    pub query_memory_limit_bytes: u64,
    /// Longest one query may run (`None`: no limit).
    pub query_timeout: Option<Duration>,
    /// A storage node in this process (standalone): its scans are called,
    /// not streamed over loopback.
    pub local_storage: Option<LocalStorage>,
}

pub struct QueryServer {
    http_addr: SocketAddr,
    pg_addr: SocketAddr,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl QueryServer {
    pub async fn start(cfg: QueryConfig) -> Result<QueryServer> {
        let meta = MetaClient::connect(&cfg.meta_addrs, Duration::from_secs(60)).await?;
        let storage = Arc::new(StorageClients::with_local(cfg.local_storage));
        let router = Arc::new(WriteRouter {
            meta: meta.clone(),
            storage: storage.clone(),
        });
        let shared = Shared {
            meta,
            storage,
            router,
        };
        let sql = SqlEngine::new(
            shared.clone(),
            cfg.query_memory_limit_bytes,
            cfg.query_timeout,
        )?;
        let ctx = Arc::new(QueryContext {
            shared,
            sql: sql.clone(),
            schemas: Default::default(),
        });
        let _ = sealion_common::telemetry::prometheus();

        let (stop_tx, stop_rx) = watch::channel(false);
        let http_listener = tokio::net::TcpListener::bind(cfg.http_addr)
            .await
            .map_err(|e| {
                Error::Internal(format!("cannot listen for HTTP on {}: {e}", cfg.http_addr))
            })?;
        let http_addr = http_listener
            .local_addr()
            .map_err(|e| Error::Internal(e.to_string()))?;
        let pg_listener = tokio::net::TcpListener::bind(cfg.pg_addr)
            .await
            .map_err(|e| {
                Error::Internal(format!(
                    "cannot listen for PostgreSQL on {}: {e}",
                    cfg.pg_addr
                ))
            })?;
        let pg_addr = pg_listener
            .local_addr()
            .map_err(|e| Error::Internal(e.to_string()))?;

        let app = crate::http::router(ctx);
        let mut http_stop = stop_rx.clone();
        let http = tokio::spawn(async move {
            let served = axum::serve(http_listener, app)
                .with_graceful_shutdown(async move {
                    let _ = http_stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "HTTP server failed");
            }
        });
        let handlers = Arc::new(PgHandlers::new(sql));
        let pg = tokio::spawn(pg_accept_loop(
            pg_listener,
            handlers,
            stop_rx,
            cfg.pg_max_connections.max(1),
        ));
        tracing::info!(%http_addr, %pg_addr, "query node serving");
        Ok(QueryServer {
            http_addr,
            pg_addr,
            stop_tx,
            tasks: vec![http, pg],
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn pg_addr(&self) -> SocketAddr {
        self.pg_addr
    }

    /// Stops accepting, lets HTTP requests in flight finish (bounded), and
    /// returns.
    pub async fn shutdown(self) {
        let _ = self.stop_tx.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

async fn pg_accept_loop(
    listener: tokio::net::TcpListener,
    handlers: Arc<PgHandlers>,
    mut stop: watch::Receiver<bool>,
    max_connections: usize,
) {
    let limit = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, max_connections, "PostgreSQL connection refused: too many connections");
                        continue;
                    };
                    let handlers = handlers.clone();
                    let _ = socket.set_nodelay(true);
                    tokio::spawn(async move {
                        if let Err(e) = datafusion_postgres::pgwire::tokio::process_socket(socket, None, handlers).await {
                            tracing::debug!(%peer, error = %e, "PostgreSQL connection ended with an error");
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
