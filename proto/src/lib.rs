//! Sealion's wire formats, generated from `proto/sealion.proto`.
//!
//! The generated types double as the catalog types everywhere else: one
//! definition of a table, node or partition, whether it is in a Raft log
//! entry, a gRPC message or a system table.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("sealion.v1");
}

pub use v1::*;
