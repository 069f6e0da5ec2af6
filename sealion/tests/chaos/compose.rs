//! The compose cluster (deploy/docker-compose.yml: 3 meta, 3 storage, 2
//! query nodes, each a container) as a chaos target. Faults are Docker's:
//! `docker kill -s KILL`, `docker pause` (the cgroup freezer, as SIGSTOP),
//! and `docker network disconnect` to cut a container off the cluster's
//! network. chaos/compose.chaos.yml publishes the meta replicas' ports on
//! loopback so the harness can ask which one leads.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{Http, eventually, free_base_port, meta_leader, meta_voters, storage_nodes_up};

pub struct Compose {
    project: String,
    /// docker compose, or Debian's docker-compose.
    compose: Vec<String>,
    ports: Vec<(String, String)>,
    /// Query node 1 and 2.
    pub http: [Http; 2],
    pub meta_addrs: Vec<String>,
    /// Services cut off the network now.
    cut: BTreeSet<String>,
}

fn run(cmd: &[String], env: &[(String, String)]) -> Result<String, String> {
    let out = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn docker(args: &[&str]) -> Result<String, String> {
    let mut cmd = vec!["docker".to_string()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    run(&cmd, &[])
}

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

impl Compose {
    /// Starts the cluster from image `SEALION_IMAGE` (default
    /// `sealion:local`, made by deploy/build-image.sh) under a project name
    /// of its own, with free loopback ports, and waits until it serves.
    pub async fn start() -> Compose {
        let compose = if run(&["docker".into(), "compose".into(), "version".into()], &[]).is_ok() {
            vec!["docker".to_string(), "compose".to_string()]
        } else {
            vec!["docker-compose".to_string()]
        };
        let base = free_base_port();
        let names = [
            "SEALION_HTTP_PORT_1",
            "SEALION_HTTP_PORT_2",
            "SEALION_PG_PORT_1",
            "SEALION_PG_PORT_2",
            "SEALION_META_PORT_1",
            "SEALION_META_PORT_2",
            "SEALION_META_PORT_3",
        ];
        let ports: Vec<(String, String)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), (base + i as u16).to_string()))
            .collect();
        let port = |n: &str| ports.iter().find(|(k, _)| k == n).unwrap().1.clone();
        let c = Compose {
            project: format!("sealion-chaos-{}", std::process::id()),
            compose,
            http: [
                Http::new(&format!("127.0.0.1:{}", port("SEALION_HTTP_PORT_1"))),
                Http::new(&format!("127.0.0.1:{}", port("SEALION_HTTP_PORT_2"))),
            ],
            meta_addrs: (1..=3)
                .map(|i| format!("127.0.0.1:{}", port(&format!("SEALION_META_PORT_{i}"))))
                .collect(),
            ports,
            cut: BTreeSet::new(),
        };
        c.dc(&["up", "-d"]).unwrap();
        for h in &c.http {
            eventually("a query node healthy", Duration::from_secs(180), || async {
                h.healthy().await.then_some(())
            })
            .await;
        }
        storage_nodes_up(&c.http[0], 3, Duration::from_secs(120)).await;
        eventually("three meta voters", Duration::from_secs(120), || {
            meta_voters(&c.meta_addrs, 3)
        })
        .await;
        c
    }

    fn dc(&self, args: &[&str]) -> Result<String, String> {
        let root = repo_root();
        let mut cmd = self.compose.clone();
        cmd.extend(
            [
                "-p",
                &self.project,
                "-f",
                &root.join("deploy/docker-compose.yml").display().to_string(),
                "-f",
                &root.join("chaos/compose.chaos.yml").display().to_string(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        cmd.extend(args.iter().map(|a| a.to_string()));
        run(&cmd, &self.ports)
    }

    fn container(&self, service: &str) -> String {
        self.dc(&["ps", "-q", service]).unwrap()
    }

    /// The network the services share (compose names it after the project).
    fn network(&self) -> String {
        format!("{}_default", self.project)
    }

    pub fn kill(&self, service: &str) {
        docker(&["kill", "-s", "KILL", &self.container(service)]).unwrap();
    }

    pub fn start_again(&self, service: &str) {
        docker(&["start", &self.container(service)]).unwrap();
    }

    pub fn pause(&self, service: &str) {
        docker(&["pause", &self.container(service)]).unwrap();
    }

    pub fn resume(&self, service: &str) {
        docker(&["unpause", &self.container(service)]).unwrap();
    }

    /// Cuts `service` off the cluster's network: it keeps running and
    /// neither reaches nor is reached by the others.
    pub fn cut(&mut self, service: &str) {
        docker(&[
            "network",
            "disconnect",
            "-f",
            &self.network(),
            &self.container(service),
        ])
        .unwrap();
        self.cut.insert(service.to_string());
    }

    /// Joins `service` to the network again, under its service name.
    pub fn reconnect(&mut self, service: &str) {
        docker(&[
            "network",
            "connect",
            "--alias",
            service,
            &self.network(),
            &self.container(service),
        ])
        .unwrap();
        self.cut.remove(service);
    }

    pub async fn meta_leader(&self) -> Option<u64> {
        meta_leader(&self.meta_addrs).await
    }

    /// Every container running, unpaused and on the network.
    pub fn heal(&mut self) {
        for s in self.cut.clone() {
            self.reconnect(&s);
        }
        for s in [
            "meta1", "meta2", "meta3", "storage1", "storage2", "storage3",
        ] {
            let id = self.container(s);
            let state = docker(&["inspect", "-f", "{{.State.Status}}", &id]).unwrap_or_default();
            match state.as_str() {
                "paused" => self.resume(s),
                "running" => {}
                _ => self.start_again(s),
            }
        }
    }

    /// The last lines of every container's log (for a failing run).
    pub fn dump(&self) {
        match self.dc(&["logs", "--no-color", "--tail", "60"]) {
            Ok(logs) => eprintln!("{logs}"),
            Err(e) => eprintln!("no logs: {e}"),
        }
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::env::var("KEEP").as_deref() != Ok("1") {
            let _ = self.dc(&["down", "-v", "--remove-orphans"]);
        }
    }
}
