//! Three replicas in one process: joining by address, forwarding from
//! followers, watch, heartbeats and liveness, a follower catching up after a
//! restart, and failover when the leader stops.

use std::net::SocketAddr;
use std::time::Duration;

use sealion_common::meta_client::MetaClient;
use sealion_proto::meta_command::Cmd;
use sealion_proto::{
    CreateDatabase, EnsurePartitions, GetStateRequest, HeartbeatRequest, MetaClusterRequest,
    MetaCommand, NodeState, ProposeRequest, RegisterNode, WatchRequest,
};

use crate::*;

const WAIT: Duration = Duration::from_secs(15);

/// Voters the replica at `addr` counts once no membership change is under
/// way (0 while one is, or when it cannot be reached).
async fn voters(addr: SocketAddr) -> usize {
    match grpc(addr).await.cluster_info(MetaClusterRequest {}).await {
        Ok(info) if info.get_ref().membership_settled => {
            info.into_inner().members.iter().filter(|m| m.voter).count()
        }
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_forward_catch_up_and_fail_over() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();

    let mut cfg1 = config(1, any_port(), dirs[0].path());
    // Long enough that a storage node heard from once stays up for the
    // whole test, however slow the machine.
    cfg1.node_timeout_ms = 30_000;
    cfg1.bootstrap = true;
    let n1 = start(cfg1.clone()).await;
    let a1 = n1.local_addr();
    cfg1.listen_addr = a1;
    eventually("node 1 to lead", WAIT, || async {
        (leader_of(a1).await == Some(1)).then_some(())
    })
    .await;

    let mut cfgs = vec![cfg1];
    let mut servers = vec![Some(n1)];
    for id in 2..=3u64 {
        let mut cfg = config(id, any_port(), dirs[id as usize - 1].path());
        cfg.join = vec![a1.to_string()];
        cfg.node_timeout_ms = 30_000;
        let server = start(cfg.clone()).await;
        cfg.listen_addr = server.local_addr();
        cfgs.push(cfg);
        servers.push(Some(server));
    }
    let addrs: Vec<SocketAddr> = cfgs.iter().map(|c| c.listen_addr).collect();
    eventually("three voters", WAIT, || async {
        (voters(a1).await == 3).then_some(())
    })
    .await;

    // A proposal sent to a follower is forwarded to the leader.
    let mut follower = grpc(addrs[1]).await;
    let reply = follower
        .propose(ProposeRequest {
            command: Some(MetaCommand {
                cmd: Some(create_table("public", "cpu")),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.error, "");
    let table = reply.table.unwrap();

    // The shared client, pointed at followers only.
    let client = MetaClient::connect(&[addrs[2].to_string(), addrs[1].to_string()], WAIT)
        .await
        .unwrap();
    let dup = client
        .propose(create_table("public", "cpu"))
        .await
        .unwrap_err();
    assert!(
        matches!(&dup, sealion_common::Error::Rejected { kind, .. } if kind == "already_exists"),
        "{dup:?}"
    );

    // Watch on a follower delivers the state after a proposal.
    let mut watch = grpc(addrs[2])
        .await
        .watch(WatchRequest {
            after_version: u64::MAX,
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap().state.unwrap();
    let created = client
        .propose(Cmd::CreateDatabase(CreateDatabase {
            name: "watched".into(),
            if_not_exists: false,
        }))
        .await
        .unwrap();
    assert!(created.version > first.version);
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            let s = watch.message().await.unwrap().unwrap().state.unwrap();
            if s.version >= created.version {
                return s;
            }
        }
    })
    .await
    .unwrap();
    assert!(seen.databases.iter().any(|d| d.name == "watched"));

    // Heartbeats through a follower reach the leader's liveness table.
    let unknown = follower
        .heartbeat(HeartbeatRequest {
            node_id: 77,
            addr: "127.0.0.1:9177".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!unknown.known);
    let node = client
        .propose(Cmd::RegisterNode(RegisterNode {
            id: 0,
            addr: "127.0.0.1:9101".into(),
            now_ms: 5,
        }))
        .await
        .unwrap()
        .node
        .unwrap();
    assert!(client.heartbeat(node.id, &node.addr).await.unwrap());
    let live = client.get_state(true).await.unwrap();
    let entry = live.liveness.iter().find(|l| l.node_id == node.id).unwrap();
    assert_eq!(entry.state(), NodeState::Up);
    assert!(entry.last_heartbeat_ms > 0);

    let parts = client
        .propose(Cmd::EnsurePartitions(EnsurePartitions {
            table_id: table.id,
            starts_ns: vec![0],
            placements: vec![],
        }))
        .await
        .unwrap();
    assert_eq!(parts.partitions[0].replicas, vec![node.id]);

    // Stop a follower, change more, restart it: it catches up.
    let leader = leader_of(a1).await.unwrap();
    let stopped = (1..=3u64).find(|id| *id != leader).unwrap();
    let si = stopped as usize - 1;
    servers[si].take().unwrap().shutdown().await.unwrap();
    let mut last = 0;
    for i in 0..5 {
        last = client
            .propose(Cmd::CreateDatabase(CreateDatabase {
                name: format!("while_down_{i}"),
                if_not_exists: false,
            }))
            .await
            .unwrap()
            .version;
    }
    // Snapshot on the leader and purge its log, so the follower can only
    // catch up by receiving the snapshot over the RaftSnapshot RPC.
    let leader_raft = servers[leader as usize - 1]
        .as_ref()
        .unwrap()
        .raft()
        .clone();
    leader_raft.trigger().snapshot().await.unwrap();
    eventually("a leader snapshot", WAIT, || async {
        let m = leader_raft.metrics().borrow().clone();
        m.snapshot.filter(|s| s.index >= last).map(|_| ())
    })
    .await;
    leader_raft.trigger().purge_log(last).await.unwrap();
    eventually("the leader to purge its log", WAIT, || async {
        let m = leader_raft.metrics().borrow().clone();
        m.purged.filter(|p| p.index >= last).map(|_| ())
    })
    .await;
    servers[si] = Some(start(cfgs[si].clone()).await);
    let caught_up = eventually("the restarted follower to catch up", WAIT, || async {
        local_state(addrs[si]).await.filter(|s| s.version >= last)
    })
    .await;
    let follower_snapshot = servers[si]
        .as_ref()
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .snapshot;
    assert!(
        follower_snapshot.is_some_and(|s| s.index >= last),
        "the follower caught up from the leader's snapshot: {follower_snapshot:?}"
    );
    let leader_state = grpc(addrs[leader as usize - 1])
        .await
        .get_state(GetStateRequest { linearizable: true })
        .await
        .unwrap()
        .into_inner()
        .state
        .unwrap();
    assert_eq!(content(&caught_up), content(&leader_state));

    // Stop the leader: the other two elect a new one and keep taking changes.
    let li = leader as usize - 1;
    servers[li].take().unwrap().shutdown().await.unwrap();
    let survivors: Vec<SocketAddr> = (0..3).filter(|i| *i != li).map(|i| addrs[i]).collect();
    let new_leader = eventually("a new leader", WAIT, || async {
        match leader_of(survivors[0]).await {
            Some(l) if l != leader => Some(l),
            _ => None,
        }
    })
    .await;
    assert_ne!(new_leader, leader);
    let after = client
        .propose(Cmd::CreateDatabase(CreateDatabase {
            name: "after_failover".into(),
            if_not_exists: false,
        }))
        .await
        .unwrap();
    for addr in &survivors {
        let s = eventually("survivors to apply", WAIT, || async {
            local_state(*addr)
                .await
                .filter(|s| s.version >= after.version)
        })
        .await;
        assert!(s.databases.iter().any(|d| d.name == "after_failover"));
    }
    // The node heard from before the failover is not marked down at once.
    let live = client.get_state(true).await.unwrap();
    let entry = live.liveness.iter().find(|l| l.node_id == node.id).unwrap();
    assert_eq!(entry.state(), NodeState::Up);

    drop(client);
    for server in servers.into_iter().flatten() {
        server.shutdown().await.unwrap();
    }
}
