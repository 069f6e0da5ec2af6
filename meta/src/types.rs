//! The Raft type configuration: which of Sealion's types openraft carries.
//!
//! Kept apart so the store, the network and the service agree on one
//! definition. Commands and responses are the proto messages themselves
//! (they derive serde), so a log entry is exactly the `MetaCommand` a client
//! proposed.

use std::io::Cursor;

use sealion_proto::{MetaCommand, MetaResponse};

openraft::declare_raft_types!(
    /// Sealion meta's Raft: u64 node ids, `BasicNode { addr }` nodes,
    /// snapshots as in-memory JSON.
    pub TypeConfig:
        D = MetaCommand,
        R = MetaResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Node = openraft::BasicNode;
pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
