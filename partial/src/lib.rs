//! Mergeable partial aggregate states.
//!
//! Why this crate exists: a storage node computes the first half of an
//! aggregation (one [`State`] per group: per time bucket and tag values) and
//! sends the states to a query node, which merges the states of many nodes
//! and partitions and finalizes them. Rollups will store the same states. So
//! there is one set of state types, one stable versioned byte form
//! ([`codec`]), and merges that are associative and commutative, so that the
//! answer does not depend on how rows were split or in what order states
//! meet.
//!
//! ```
//! use sealion_partial::{AggregateKind, Finalize, State, Value, ValueType};
//!
//! // Two storage nodes, each with part of the rows.
//! let mut a = State::new(AggregateKind::Avg, ValueType::I64)?;
//! let mut b = State::new(AggregateKind::Avg, ValueType::I64)?;
//! a.update(1_000, &Value::I64(1))?;
//! b.update(2_000, &Value::I64(2))?;
//! b.update(3_000, &Value::I64(6))?;
//!
//! // The query node merges what it received and finalizes.
//! let mut merged = State::decode(&a.encode())?;
//! merged.merge(&State::decode(&b.encode())?)?;
//! assert_eq!(merged.finalize(Finalize::Natural)?, Some(Value::F64(3.0)));
//! # Ok::<(), sealion_partial::Error>(())
//! ```
//!
//! Nulls never reach a state: the caller skips them. The kinds, the types
//! each takes and what each finalizes to are on [`AggregateKind`]; the value
//! order used by min/max/first/last and the float rules on [`Value`].
//!
//! Limits: [`MAX_DISTINCT_VALUES`] and [`MAX_DISTINCT_BYTES`] for
//! `count(DISTINCT)`, [`TDIGEST_MAX_SIZE`] centroids for `percentile`, 2^14
//! one-byte registers for `approx_distinct`, [`MAX_STRING_BYTES`] per text
//! value; the decoder bounds every length by the bytes it was given.
//!
//! Must never: depend on another Sealion crate, Arrow or DataFusion (the
//! query node adapts states to DataFusion's accumulators), or hash with a
//! per-process random seed.

pub mod codec;
mod distinct;
mod error;
mod float;
mod groups;
mod hll;
mod kind;
mod percentile;
mod state;
mod summary;
mod value;

pub use codec::FORMAT_VERSION;
pub use distinct::{MAX_DISTINCT_BYTES, MAX_DISTINCT_VALUES};
pub use error::{Error, Result};
pub use groups::GroupStates;
pub use hll::{HLL_HASH_SEED, HLL_PRECISION};
pub use kind::{AggregateKind, Finalize};
pub use percentile::TDIGEST_MAX_SIZE;
pub use state::{MAX_STRING_BYTES, State};
pub use summary::SumOf;
pub use value::{CANONICAL_NAN_BITS, Value, ValueType};
