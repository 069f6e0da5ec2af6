//! What only the leader knows: storage-node liveness from heartbeats, and the
//! placement of new partitions that follows from it.
//!
//! Heartbeats arrive every second or so from every storage node; writing
//! them into the Raft log would turn the log into a clock. They are kept in
//! memory on the leader instead, and a new leader starts with a grace period
//! rather than declaring every node down. Placement is decided here, before
//! the command is proposed, so that `machine::apply` stays deterministic.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sealion_common::time::partition_start;
use sealion_proto::{
    ClusterState, EnsurePartitions, NodeLiveness, NodeState, PartitionPlacement, ReplicaChange,
};

use crate::machine::{Refusal, kind, table_interval_ns};

/// Last heartbeat per storage node, as seen by this replica.
#[derive(Debug)]
pub struct Liveness {
    timeout: Duration,
    /// node id → (when, wall-clock ms) of its last heartbeat.
    last: HashMap<u64, (Instant, i64)>,
    /// When this replica last became leader: nodes not heard from since are
    /// given `timeout` from this instant before they count as down.
    leader_since: Instant,
}

impl Liveness {
    pub fn new(timeout: Duration) -> Self {
        Liveness {
            timeout,
            last: HashMap::new(),
            leader_since: Instant::now(),
        }
    }

    pub fn record(&mut self, node_id: u64, now_ms: i64) {
        self.last.insert(node_id, (Instant::now(), now_ms));
    }

    /// Called when this replica becomes leader.
    pub fn became_leader(&mut self) {
        self.leader_since = Instant::now();
    }

    /// Up when heard from within the timeout, counting the start of this
    /// leadership as a heartbeat: a replica that just took over has not been
    /// told about heartbeats that went to the old leader.
    pub fn is_up(&self, node_id: u64) -> bool {
        let since = match self.last.get(&node_id) {
            Some((at, _)) => (*at).max(self.leader_since),
            None => self.leader_since,
        };
        Instant::now().duration_since(since) <= self.timeout
    }

    /// How long node `node_id` has been silent, counting from the start of
    /// this leadership at the latest (as `is_up` does).
    pub fn silent_for(&self, node_id: u64) -> Duration {
        let since = match self.last.get(&node_id) {
            Some((at, _)) => (*at).max(self.leader_since),
            None => self.leader_since,
        };
        Instant::now().duration_since(since)
    }

    /// Liveness of every node of `state`, by id.
    pub fn report(&self, state: &ClusterState) -> Vec<NodeLiveness> {
        let mut out: Vec<NodeLiveness> = state
            .nodes
            .iter()
            .map(|n| NodeLiveness {
                node_id: n.id,
                state: if self.is_up(n.id) {
                    NodeState::Up as i32
                } else {
                    NodeState::Down as i32
                },
                last_heartbeat_ms: self.last.get(&n.id).map_or(0, |(_, ms)| *ms),
            })
            .collect();
        out.sort_by_key(|l| l.node_id);
        out
    }
}

/// How far over the mean replica count per node a node may be filled by new
/// placements (the bound of consistent hashing with bounded loads).
pub const LOAD_BOUND: f64 = 1.25;

/// A node's rank for a partition key in rendezvous (highest random weight)
/// hashing: every key ranks all nodes in its own pseudo-random order, so a
/// node that joins or leaves changes only the keys it ranks first.
fn rank(table_id: u64, start_ns: i64, shard: u32, node: u64) -> u64 {
    use std::hash::Hasher;
    let mut h = twox_hash::XxHash64::with_seed(0x5ea1_10d1_9a1c_0001);
    h.write(&table_id.to_le_bytes());
    h.write(&start_ns.to_le_bytes());
    h.write(&shard.to_le_bytes());
    h.write(&node.to_le_bytes());
    h.finish()
}

/// Fills `cmd.placements` for every requested start that has no partition
/// yet (one per shard of the table), by consistent hashing with bounded
/// loads on the key (table, start, shard): the table's replication factor
/// (or, when it has none, `replication_factor`)
/// distinct nodes (capped at the number of nodes), taken in the key's
/// rendezvous order among the nodes that are up and hold fewer than
/// `LOAD_BOUND` times the mean number of replicas; when those are too few,
/// the key's order among the rest fills the set (nodes that are up first).
/// The primary is the chosen node that is up and leads the fewest. Starts
/// that `apply` will refuse anyway (no table, misaligned) are left alone so
/// that the refusal comes from the state machine.
pub fn place(
    state: &ClusterState,
    cmd: &mut EnsurePartitions,
    is_up: impl Fn(u64) -> bool,
    replication_factor: usize,
) -> Result<(), Refusal> {
    let Some(table) = state.tables.iter().find(|t| t.id == cmd.table_id) else {
        return Ok(());
    };
    let interval_ns = table_interval_ns(table);
    let mut missing: Vec<i64> = cmd
        .starts_ns
        .iter()
        .copied()
        .filter(|s| partition_start(*s, interval_ns) == Some(*s))
        .filter(|s| {
            !state
                .partitions
                .iter()
                .any(|p| p.table_id == cmd.table_id && p.start_ns == *s)
        })
        .collect();
    missing.sort_unstable();
    missing.dedup();
    cmd.placements.retain(|p| !missing.contains(&p.start_ns));
    if missing.is_empty() {
        return Ok(());
    }
    if state.nodes.is_empty() {
        return Err(Refusal::new(
            kind::UNAVAILABLE,
            "no storage node has registered: cannot place new partitions",
        ));
    }
    let mut load: HashMap<u64, usize> = state.nodes.iter().map(|n| (n.id, 0)).collect();
    let mut total = 0usize;
    for p in &state.partitions {
        for r in &p.replicas {
            if let Some(c) = load.get_mut(r) {
                *c += 1;
                total += 1;
            }
        }
    }
    // Primaries are spread on their own: with as many replicas as nodes,
    // every node holds everything, and reads go to primaries.
    let mut led: HashMap<u64, usize> = state.nodes.iter().map(|n| (n.id, 0)).collect();
    for p in &state.partitions {
        if let Some(c) = p.replicas.first().and_then(|r| led.get_mut(r)) {
            *c += 1;
        }
    }
    let up: HashMap<u64, bool> = state.nodes.iter().map(|n| (n.id, is_up(n.id))).collect();
    let is_up = |id: &u64| up.get(id).copied().unwrap_or(false);
    let nodes = state.nodes.len();
    let rf = match table.replication_factor {
        0 => replication_factor,
        n => n as usize,
    }
    .clamp(1, nodes);
    let shards = crate::machine::table_shards(table);
    for (start, shard) in missing
        .into_iter()
        .flat_map(|s| (0..shards).map(move |shard| (s, shard)))
    {
        total += rf;
        let cap = (LOAD_BOUND * total as f64 / nodes as f64).ceil() as usize;
        let mut order: Vec<u64> = state.nodes.iter().map(|n| n.id).collect();
        order.sort_by_key(|id| std::cmp::Reverse(rank(cmd.table_id, start, shard, *id)));
        let under = |id: &u64| load.get(id).copied().unwrap_or(0) < cap;
        let mut candidates: Vec<u64> = Vec::with_capacity(rf);
        for pass in 0..3 {
            for id in &order {
                if candidates.len() == rf {
                    break;
                }
                let fits = match pass {
                    0 => is_up(id) && under(id),
                    1 => is_up(id),
                    _ => true,
                };
                if fits && !candidates.contains(id) {
                    candidates.push(*id);
                }
            }
        }
        // The primary: the chosen node that is up and leads the fewest.
        if let Some(best) = (0..candidates.len()).min_by_key(|&i| {
            let id = candidates[i];
            (!is_up(&id), led.get(&id).copied().unwrap_or(0), i)
        }) {
            candidates[..=best].rotate_right(1);
        }
        for id in &candidates {
            if let Some(c) = load.get_mut(id) {
                *c += 1;
            }
        }
        if let Some(c) = candidates.first().and_then(|id| led.get_mut(id)) {
            *c += 1;
        }
        cmd.placements.push(PartitionPlacement {
            start_ns: start,
            replicas: candidates,
            shard,
        });
    }
    Ok(())
}

/// What failover changes: every partition with an in-sync replica that is
/// down loses it from the in-sync set; when that was the primary, the first
/// in-sync replica that is up becomes primary. A partition whose in-sync
/// replicas are all down is left as it is: only an in-sync replica may be
/// promoted, and none is there to promote.
pub fn failover_changes(state: &ClusterState, is_up: impl Fn(u64) -> bool) -> Vec<ReplicaChange> {
    let mut out = Vec::new();
    for p in &state.partitions {
        let down: Vec<u64> = p.in_sync.iter().copied().filter(|id| !is_up(*id)).collect();
        if down.is_empty() {
            continue;
        }
        let in_sync: Vec<u64> = p.in_sync.iter().copied().filter(|id| is_up(*id)).collect();
        let Some(&first_live) = p.replicas.iter().find(|id| in_sync.contains(id)) else {
            continue;
        };
        let primary = match p.replicas.first() {
            Some(&old) if in_sync.contains(&old) => old,
            _ => first_live,
        };
        let mut replicas = vec![primary];
        replicas.extend(p.replicas.iter().copied().filter(|id| *id != primary));
        out.push(ReplicaChange {
            partition_id: p.id,
            expected_epoch: p.epoch,
            replicas,
            in_sync,
            reason: format!("node {down:?} down"),
        });
    }
    out
}

/// What re-replication changes: a replica on a node gone for good (`gone`)
/// that is no longer in sync is replaced by the least-loaded node that is up
/// and not yet a replica of the partition. The new replica starts out of
/// sync and catches up from the primary.
pub fn replacement_changes(
    state: &ClusterState,
    is_up: impl Fn(u64) -> bool,
    gone: impl Fn(u64) -> bool,
) -> Vec<ReplicaChange> {
    let mut load: HashMap<u64, usize> = state.nodes.iter().map(|n| (n.id, 0)).collect();
    for p in &state.partitions {
        for r in &p.replicas {
            if let Some(c) = load.get_mut(r) {
                *c += 1;
            }
        }
    }
    let mut out = Vec::new();
    for p in &state.partitions {
        let mut replicas = p.replicas.clone();
        let mut changed = Vec::new();
        for slot in replicas.iter_mut() {
            let old = *slot;
            if p.in_sync.contains(&old) || !gone(old) {
                continue;
            }
            let candidate = state
                .nodes
                .iter()
                .map(|n| n.id)
                .filter(|id| {
                    is_up(*id) && !p.replicas.contains(id) && !changed.iter().any(|(_, n)| n == id)
                })
                .min_by_key(|id| (load.get(id).copied().unwrap_or(0), *id));
            let Some(new) = candidate else { continue };
            *slot = new;
            *load.entry(new).or_default() += 1;
            changed.push((old, new));
        }
        if changed.is_empty() {
            continue;
        }
        out.push(ReplicaChange {
            partition_id: p.id,
            expected_epoch: p.epoch,
            replicas,
            in_sync: p.in_sync.clone(),
            reason: format!("replaced (gone, new) {changed:?}"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sealion_proto::{Partition, StorageNode, Table};

    use super::*;

    fn state(nodes: &[u64], partitions: &[(i64, Vec<u64>)]) -> ClusterState {
        ClusterState {
            tables: vec![Table {
                id: 1,
                database: "public".into(),
                name: "t".into(),
                partition_interval_ns: 10,
                ..Default::default()
            }],
            nodes: nodes
                .iter()
                .map(|id| StorageNode {
                    id: *id,
                    addr: format!("n{id}:1"),
                    registered_at_ms: 0,
                })
                .collect(),
            partitions: partitions
                .iter()
                .map(|(s, r)| Partition {
                    table_id: 1,
                    start_ns: *s,
                    end_ns: s + 10,
                    replicas: r.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ensure(starts: Vec<i64>) -> EnsurePartitions {
        EnsurePartitions {
            table_id: 1,
            starts_ns: starts,
            placements: vec![],
        }
    }

    #[test]
    fn new_partitions_stay_within_the_load_bound() {
        let nodes: Vec<u64> = (1..=5).collect();
        let mut s = state(&nodes, &[]);
        for round in 0..4 {
            let starts: Vec<i64> = (0..15).map(|i| (round * 15 + i) * 10).collect();
            let mut cmd = ensure(starts);
            place(&s, &mut cmd, |_| true, 3).unwrap();
            for p in cmd.placements {
                let mut r = p.replicas.clone();
                r.sort_unstable();
                r.dedup();
                assert_eq!(r.len(), 3, "three distinct nodes: {:?}", p.replicas);
                s.partitions.push(Partition {
                    table_id: 1,
                    start_ns: p.start_ns,
                    end_ns: p.start_ns + 10,
                    replicas: p.replicas,
                    ..Default::default()
                });
            }
        }
        let total = s.partitions.len() * 3;
        let cap = (LOAD_BOUND * total as f64 / nodes.len() as f64).ceil() as usize;
        for n in &nodes {
            let held = s
                .partitions
                .iter()
                .filter(|p| p.replicas.contains(n))
                .count();
            assert!(held <= cap, "node {n} holds {held}, over the bound {cap}");
            let led = s.partitions.iter().filter(|p| p.replicas[0] == *n).count();
            assert!(led >= 10, "node {n} leads {led} of 60");
        }
    }

    #[test]
    fn each_shard_of_a_start_is_placed_and_the_primaries_spread() {
        let mut s = state(&[1, 2, 3], &[]);
        s.tables[0].shards = 3;
        let mut cmd = ensure(vec![0, 10]);
        place(&s, &mut cmd, |_| true, 2).unwrap();
        let keys: Vec<(i64, u32)> = cmd
            .placements
            .iter()
            .map(|p| (p.start_ns, p.shard))
            .collect();
        assert_eq!(
            keys,
            vec![(0, 0), (0, 1), (0, 2), (10, 0), (10, 1), (10, 2)]
        );
        // With two replicas of three nodes the least-leading node is not
        // always among a shard's two, so the spread is close, not exact.
        for id in [1, 2, 3] {
            let led = cmd
                .placements
                .iter()
                .filter(|p| p.replicas[0] == id)
                .count();
            assert!(
                (1..=3).contains(&led),
                "node {id} leads {led}: {:?}",
                cmd.placements
            );
        }
    }

    #[test]
    fn a_table_of_its_own_replication_factor_overrides_the_cluster_one() {
        let mut s = state(&[1, 2, 3, 4], &[]);
        s.tables[0].replication_factor = 2;
        let mut cmd = ensure(vec![0]);
        place(&s, &mut cmd, |_| true, 3).unwrap();
        assert_eq!(cmd.placements[0].replicas.len(), 2);
        s.tables[0].replication_factor = 0;
        let mut cmd = ensure(vec![0]);
        place(&s, &mut cmd, |_| true, 3).unwrap();
        assert_eq!(cmd.placements[0].replicas.len(), 3);
    }

    #[test]
    fn a_node_leaving_moves_only_the_keys_it_held() {
        // With nothing placed yet the bound does not bind, and each key's
        // set is its rendezvous order: taking away a node it does not use
        // changes nothing for it.
        let all: Vec<u64> = (1..=8).collect();
        let mut moved = 0;
        for start in (0..200).map(|i| i * 10) {
            let placed = |nodes: &[u64]| {
                let mut cmd = ensure(vec![start]);
                place(&state(nodes, &[]), &mut cmd, |_| true, 3).unwrap();
                let mut r = cmd.placements[0].replicas.clone();
                r.sort_unstable();
                r
            };
            let before = placed(&all);
            let without: Vec<u64> = all.iter().copied().filter(|n| *n != 8).collect();
            let after = placed(&without);
            if before.contains(&8) {
                moved += 1;
                let kept: Vec<u64> = before.iter().copied().filter(|n| *n != 8).collect();
                assert!(
                    kept.iter().all(|n| after.contains(n)),
                    "{before:?} -> {after:?}"
                );
            } else {
                assert_eq!(before, after, "start {start}");
            }
        }
        // About 3/8 of the keys used node 8.
        assert!(
            (40..110).contains(&moved),
            "{moved} of 200 keys held node 8"
        );
    }

    #[test]
    fn prefers_nodes_that_are_up_and_caps_the_replication_factor() {
        let s = state(&[1, 2], &[]);
        let mut cmd = ensure(vec![0]);
        place(&s, &mut cmd, |id| id == 2, 1).unwrap();
        assert_eq!(cmd.placements[0].replicas, vec![2]);

        let mut cmd = ensure(vec![0]);
        place(&s, &mut cmd, |_| true, 5).unwrap();
        let mut r = cmd.placements[0].replicas.clone();
        r.sort_unstable();
        assert_eq!(r, vec![1, 2]);
    }

    #[test]
    fn with_every_node_a_replica_the_primaries_still_rotate() {
        let s = state(&[1, 2, 3], &[]);
        let mut cmd = ensure(vec![0, 10, 20, 30, 40, 50]);
        place(&s, &mut cmd, |_| true, 3).unwrap();
        let primaries: Vec<u64> = cmd.placements.iter().map(|p| p.replicas[0]).collect();
        for id in [1, 2, 3] {
            assert_eq!(
                primaries.iter().filter(|p| **p == id).count(),
                2,
                "{primaries:?}"
            );
        }
        for p in &cmd.placements {
            let mut r = p.replicas.clone();
            r.sort_unstable();
            assert_eq!(r, vec![1, 2, 3]);
        }
    }

    #[test]
    fn no_storage_node_is_unavailable_but_existing_partitions_need_none() {
        let s = state(&[], &[(0, vec![1])]);
        let mut cmd = ensure(vec![10]);
        assert_eq!(
            place(&s, &mut cmd, |_| true, 1).unwrap_err().kind,
            kind::UNAVAILABLE
        );
        let mut cmd = ensure(vec![0]);
        place(&s, &mut cmd, |_| true, 1).unwrap();
        assert!(cmd.placements.is_empty());
    }

    fn replicated(id: u64, replicas: Vec<u64>, in_sync: Vec<u64>) -> Partition {
        Partition {
            id,
            table_id: 1,
            start_ns: id as i64 * 10,
            end_ns: id as i64 * 10 + 10,
            replicas,
            in_sync,
            epoch: 4,
            ..Default::default()
        }
    }

    #[test]
    fn failover_drops_dead_replicas_and_promotes_an_in_sync_one() {
        let mut s = state(&[1, 2, 3, 4], &[]);
        s.partitions = vec![
            // Primary 1 dies: 2 is promoted, 3 stays a backup.
            replicated(1, vec![1, 2, 3], vec![1, 2, 3]),
            // A backup dies: the primary stays.
            replicated(2, vec![2, 1, 3], vec![2, 1, 3]),
            // Nothing down: untouched.
            replicated(3, vec![2, 3, 4], vec![2, 3, 4]),
            // 3 is out of sync, so it cannot be promoted; 4 can.
            replicated(4, vec![1, 3, 4], vec![1, 4]),
            // Every in-sync replica is down: nothing to promote, left alone.
            replicated(5, vec![1, 2], vec![1]),
        ];
        let changes = failover_changes(&s, |id| id != 1);
        let got: Vec<(u64, u64, Vec<u64>, Vec<u64>)> = changes
            .iter()
            .map(|c| {
                (
                    c.partition_id,
                    c.expected_epoch,
                    c.replicas.clone(),
                    c.in_sync.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 4, vec![2, 1, 3], vec![2, 3]),
                (2, 4, vec![2, 1, 3], vec![2, 3]),
                (4, 4, vec![4, 1, 3], vec![4]),
            ]
        );
    }

    #[test]
    fn a_node_gone_for_good_is_replaced_by_the_least_loaded_live_one() {
        let mut s = state(&[1, 2, 3, 4, 5], &[]);
        s.partitions = vec![
            replicated(1, vec![2, 1, 3], vec![2, 3]),
            replicated(2, vec![2, 4, 1], vec![2, 4]),
            // Still in sync (failover has not run yet): not replaced.
            replicated(3, vec![1, 2], vec![1, 2]),
        ];
        // Node 1 is gone. Partition 1 takes 5 (it holds nothing); then 5
        // and 3 hold one each for partition 2, and the lower id wins.
        let changes = replacement_changes(&s, |id| id != 1, |id| id == 1);
        let got: Vec<(u64, Vec<u64>, Vec<u64>)> = changes
            .iter()
            .map(|c| (c.partition_id, c.replicas.clone(), c.in_sync.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, vec![2, 5, 3], vec![2, 3]),
                (2, vec![2, 4, 3], vec![2, 4])
            ]
        );
    }

    #[test]
    fn new_leader_gives_silent_nodes_a_grace_period() {
        let mut l = Liveness::new(Duration::from_millis(50));
        l.became_leader();
        assert!(l.is_up(7), "never heard from, but the leader is new");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!l.is_up(7));
        l.record(7, 1);
        assert!(l.is_up(7));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!l.is_up(7));
        l.became_leader();
        assert!(
            l.is_up(7),
            "an old heartbeat does not make a node down under a new leader"
        );
    }
}
