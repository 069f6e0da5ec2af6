//! [`GroupStates`]: the states of one aggregate call, one per group, kept
//! as a column.
//!
//! Why this exists: an aggregate over many small groups (a host-minute of
//! TSBS data is six rows) spends most of its time on the states themselves
//! when each group holds a [`State`]: made, cloned, matched on, finalized
//! and dropped one by one. A column keeps the common kinds as plain
//! numbers: a count; the order key of a float minimum or maximum (so a run
//! of floats folds in by one integer max or min); an integer minimum or
//! maximum; a float sum. Every other kind keeps one `State` per group.
//!
//! Every operation answers exactly as the same operation on a `Vec<State>`
//! would: the fast paths take only the cases they reproduce bit for bit,
//! and anything else goes through the group's `State` (made, changed and
//! stored back, so an error leaves the group as it was).
//!
//! Must never: answer differently from that `Vec<State>` (the crate's
//! tests hold it to one, call by call, for every kind and type).

use std::cmp::Ordering;

use crate::error::{Error, Result};
use crate::float::FloatSum;
use crate::kind::{AggregateKind, Finalize};
use crate::state::{Body, State, count_add, f64_from_order_key, f64_order_key};
use crate::summary::SumOf;
use crate::value::{Value, ValueType, canonical_f64};

/// The states of one call (one kind over one input type), one per group,
/// groups numbered from 0 in the order they were pushed.
#[derive(Debug, Clone)]
pub struct GroupStates {
    kind: AggregateKind,
    input: ValueType,
    store: Store,
}

#[derive(Debug, Clone)]
enum Store {
    /// `count`: the count.
    Count(Vec<u64>),
    /// `min`/`max` over `F64`: the order key ([`f64_order_key`]) of the
    /// canonical extreme, or `none` for a group with no value. `none` is
    /// the key of a NaN no state keeps (a state's NaN is canonical) and
    /// the worst key for the kind, so folding a key in is one `max`/`min`.
    FloatExtreme { keys: Vec<i64>, none: i64 },
    /// `min`/`max` over `I64`.
    IntExtreme(Vec<Option<i64>>),
    /// `sum`/`avg` over `F64`: the count and the compensated sum.
    FloatSum(Vec<(u64, FloatSum)>),
    /// Every other kind, and a fresh state of it for new groups.
    States { states: Vec<State>, empty: State },
}

impl GroupStates {
    /// No groups yet, for states of `kind` over `input`; an error when the
    /// kind does not take that type.
    pub fn new(kind: AggregateKind, input: ValueType) -> Result<GroupStates> {
        let empty = State::new(kind, input)?;
        let store = match (kind, input) {
            (AggregateKind::Count, _) => Store::Count(Vec::new()),
            (AggregateKind::Max, ValueType::F64) => Store::FloatExtreme {
                keys: Vec::new(),
                none: i64::MIN,
            },
            (AggregateKind::Min, ValueType::F64) => Store::FloatExtreme {
                keys: Vec::new(),
                none: i64::MAX,
            },
            (AggregateKind::Min | AggregateKind::Max, ValueType::I64) => {
                Store::IntExtreme(Vec::new())
            }
            (AggregateKind::Sum | AggregateKind::Avg, ValueType::F64) => {
                Store::FloatSum(Vec::new())
            }
            _ => Store::States {
                states: Vec::new(),
                empty,
            },
        };
        Ok(GroupStates { kind, input, store })
    }

    pub fn kind(&self) -> AggregateKind {
        self.kind
    }

    pub fn input_type(&self) -> ValueType {
        self.input
    }

    /// How many groups there are.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Count(v) => v.len(),
            Store::FloatExtreme { keys, .. } => keys.len(),
            Store::IntExtreme(v) => v.len(),
            Store::FloatSum(v) => v.len(),
            Store::States { states, .. } => states.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for `n` more groups.
    pub fn reserve(&mut self, n: usize) {
        match &mut self.store {
            Store::Count(v) => v.reserve(n),
            Store::FloatExtreme { keys, .. } => keys.reserve(n),
            Store::IntExtreme(v) => v.reserve(n),
            Store::FloatSum(v) => v.reserve(n),
            Store::States { states, .. } => states.reserve(n),
        }
    }

    /// Adds a group with an empty state; it is group `len() - 1`.
    pub fn push_empty(&mut self) {
        match &mut self.store {
            Store::Count(v) => v.push(0),
            Store::FloatExtreme { keys, none } => keys.push(*none),
            Store::IntExtreme(v) => v.push(None),
            Store::FloatSum(v) => v.push((0, FloatSum::default())),
            Store::States { states, empty } => states.push(empty.clone()),
        }
    }

    /// Keeps the groups for which `keep(group)` is true, in their order
    /// (they are numbered anew from 0).
    pub fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        fn go<T>(v: &mut Vec<T>, keep: &mut impl FnMut(usize) -> bool) {
            let mut g = 0;
            v.retain(|_| {
                g += 1;
                keep(g - 1)
            });
        }
        match &mut self.store {
            Store::Count(v) => go(v, &mut keep),
            Store::FloatExtreme { keys, .. } => go(keys, &mut keep),
            Store::IntExtreme(v) => go(v, &mut keep),
            Store::FloatSum(v) => go(v, &mut keep),
            Store::States { states, .. } => go(states, &mut keep),
        }
    }

    fn no_group(&self, group: usize) -> Error {
        Error::NoGroup {
            group,
            groups: self.len(),
        }
    }

    /// The state of group `group`.
    pub fn state(&self, group: usize) -> Result<State> {
        let missing = || self.no_group(group);
        let body = match &self.store {
            Store::Count(v) => Body::Count(*v.get(group).ok_or_else(missing)?),
            Store::FloatExtreme { keys, none } => {
                let key = *keys.get(group).ok_or_else(missing)?;
                Body::Extreme((key != *none).then(|| Value::F64(f64_from_order_key(key))))
            }
            Store::IntExtreme(v) => {
                Body::Extreme(v.get(group).ok_or_else(missing)?.map(Value::I64))
            }
            Store::FloatSum(v) => {
                let (count, sum) = *v.get(group).ok_or_else(missing)?;
                Body::FloatSum { count, sum }
            }
            Store::States { states, .. } => return states.get(group).cloned().ok_or_else(missing),
        };
        Ok(State {
            kind: self.kind,
            input: self.input,
            body,
        })
    }

    /// Stores `state` (of this column's kind and type, which the callers
    /// below guarantee) as group `group`'s.
    fn put(&mut self, group: usize, state: State) -> Result<()> {
        let mismatch = || Error::Corrupt("a state of another kind stored in a state column");
        match (&mut self.store, state.body) {
            (Store::Count(v), Body::Count(n)) => *slot(v, group)? = n,
            (Store::FloatExtreme { keys, none }, Body::Extreme(e)) => {
                let key = match e {
                    None => *none,
                    Some(Value::F64(x)) => f64_order_key(canonical_f64(x)),
                    Some(_) => return Err(mismatch()),
                };
                *slot(keys, group)? = key;
            }
            (Store::IntExtreme(v), Body::Extreme(e)) => {
                let x = match e {
                    None => None,
                    Some(Value::I64(x)) => Some(x),
                    Some(_) => return Err(mismatch()),
                };
                *slot(v, group)? = x;
            }
            (Store::FloatSum(v), Body::FloatSum { count, sum }) => *slot(v, group)? = (count, sum),
            (Store::States { states, .. }, body) => {
                *slot(states, group)? = State {
                    kind: self.kind,
                    input: self.input,
                    body,
                }
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// Runs `f` on group `group`'s state and keeps the result; on an error
    /// the group is as it was.
    fn with_state(&mut self, group: usize, f: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
        if let Store::States { states, .. } = &mut self.store {
            // A state's own operations leave it as it was on an error.
            return f(slot(states, group)?);
        }
        let mut state = self.state(group)?;
        f(&mut state)?;
        self.put(group, state)
    }

    /// Folds the order key of a float into a float extreme.
    fn fold_key(keys: &mut [i64], none: i64, group: usize, key: i64) -> Result<()> {
        let current = slot(keys, group)?;
        // `none` is the worst key: for max the least, for min the greatest.
        *current = if none == i64::MIN {
            (*current).max(key)
        } else {
            (*current).min(key)
        };
        Ok(())
    }

    fn wanted(&self) -> Ordering {
        match self.kind {
            AggregateKind::Max | AggregateKind::Last => Ordering::Greater,
            _ => Ordering::Less,
        }
    }

    /// [`State::update`] of group `group`.
    pub fn update(&mut self, group: usize, time_ns: i64, value: &Value) -> Result<()> {
        let want = self.wanted();
        // A count of numbers takes any value of its type (text has a length
        // limit to check, left to the state).
        let counted = value.value_type() == self.input && !matches!(value, Value::Str(_));
        match (&mut self.store, value) {
            (Store::Count(v), _) if counted => {
                let n = slot(v, group)?;
                *n = count_add(*n, 1)?;
                Ok(())
            }
            (Store::FloatExtreme { keys, none }, Value::F64(x)) => {
                Self::fold_key(keys, *none, group, f64_order_key(canonical_f64(*x)))
            }
            (Store::IntExtreme(v), Value::I64(x)) => {
                fold_int(slot(v, group)?, *x, want);
                Ok(())
            }
            (Store::FloatSum(v), Value::F64(x)) => {
                let (count, sum) = slot(v, group)?;
                *count = count_add(*count, 1)?;
                sum.add(*x);
                Ok(())
            }
            _ => self.with_state(group, |s| s.update(time_ns, value)),
        }
    }

    /// [`State::update_f64s`] of group `group`.
    pub fn update_f64s(&mut self, group: usize, values: &[f64]) -> Result<()> {
        match &mut self.store {
            Store::Count(v) if self.input == ValueType::F64 => {
                let n = slot(v, group)?;
                *n = count_add(*n, values.len() as u64)?;
                Ok(())
            }
            Store::FloatExtreme { keys, none } => {
                let run = values.iter().map(|&x| f64_order_key(canonical_f64(x)));
                let best = if *none == i64::MIN {
                    run.max()
                } else {
                    run.min()
                };
                match best {
                    Some(key) => Self::fold_key(keys, *none, group, key),
                    None => slot(keys, group).map(|_| ()),
                }
            }
            Store::FloatSum(v) => {
                let (count, sum) = slot(v, group)?;
                *count = count_add(*count, values.len() as u64)?;
                sum.add_all(values);
                Ok(())
            }
            _ => self.with_state(group, |s| s.update_f64s(values)),
        }
    }

    /// [`State::update_i64s`] of group `group`.
    pub fn update_i64s(&mut self, group: usize, values: &[i64]) -> Result<()> {
        let want = self.wanted();
        match &mut self.store {
            Store::Count(v) if self.input == ValueType::I64 => {
                let n = slot(v, group)?;
                *n = count_add(*n, values.len() as u64)?;
                Ok(())
            }
            Store::IntExtreme(v) => {
                let current = slot(v, group)?;
                let best = match want {
                    Ordering::Greater => values.iter().max(),
                    _ => values.iter().min(),
                };
                if let Some(&best) = best {
                    fold_int(current, best, want);
                }
                Ok(())
            }
            _ => self.with_state(group, |s| s.update_i64s(values)),
        }
    }

    /// [`State::update_summary`] of group `group`.
    pub fn update_summary(
        &mut self,
        group: usize,
        count: u64,
        sum: Option<SumOf>,
        min: Option<&Value>,
        max: Option<&Value>,
    ) -> Result<()> {
        self.with_state(group, |s| s.update_summary(count, sum, min, max))
    }

    /// [`State::merge`] of `other` into group `group`.
    pub fn merge(&mut self, group: usize, other: &State) -> Result<()> {
        self.with_state(group, |s| s.merge(other))
    }

    /// [`State::merge_answer`] of group `group`.
    pub fn merge_answer(&mut self, group: usize, answer: Option<&Value>) -> Result<()> {
        let want = self.wanted();
        let exists = group < self.len();
        match (&mut self.store, answer) {
            (Store::Count(v), Some(Value::I64(more))) if *more >= 0 => {
                let n = slot(v, group)?;
                *n = count_add(*n, *more as u64)?;
                Ok(())
            }
            (Store::FloatExtreme { keys, none }, Some(Value::F64(x))) => {
                Self::fold_key(keys, *none, group, f64_order_key(canonical_f64(*x)))
            }
            (Store::IntExtreme(v), Some(Value::I64(x))) => {
                fold_int(slot(v, group)?, *x, want);
                Ok(())
            }
            (Store::FloatExtreme { .. } | Store::IntExtreme(_), None) if exists => Ok(()),
            _ => self.with_state(group, |s| s.merge_answer(answer)),
        }
    }

    /// [`State::finalize`] of group `group`.
    pub fn finalize(&self, group: usize, how: Finalize) -> Result<Option<Value>> {
        let missing = || self.no_group(group);
        match (&self.store, how) {
            (Store::Count(v), Finalize::Natural) => {
                let n = *v.get(group).ok_or_else(missing)?;
                Ok(Some(Value::I64(
                    i64::try_from(n).map_err(|_| Error::CountOverflow)?,
                )))
            }
            (Store::FloatExtreme { keys, none }, Finalize::Natural) => {
                let key = *keys.get(group).ok_or_else(missing)?;
                Ok((key != *none).then(|| Value::F64(f64_from_order_key(key))))
            }
            (Store::IntExtreme(v), Finalize::Natural) => {
                Ok(v.get(group).ok_or_else(missing)?.map(Value::I64))
            }
            (Store::States { states, .. }, how) => {
                states.get(group).ok_or_else(missing)?.finalize(how)
            }
            (_, how) => self.state(group)?.finalize(how),
        }
    }

    /// For `min`/`max` over `F64`, the natural answers of `groups` without
    /// a [`Value`] each (what [`GroupStates::finalize`] gives); `None` for
    /// other kinds and for groups that do not all exist.
    pub fn float_extremes(
        &self,
        groups: std::ops::Range<usize>,
    ) -> Option<impl Iterator<Item = Option<f64>> + '_> {
        match &self.store {
            Store::FloatExtreme { keys, none } => keys.get(groups).map(|keys| {
                keys.iter()
                    .map(move |&key| (key != *none).then(|| f64_from_order_key(key)))
            }),
            _ => None,
        }
    }

    /// Appends group `group`'s state in its byte form ([`State::encode`]).
    pub fn encode_into(&self, group: usize, out: &mut Vec<u8>) -> Result<()> {
        match &self.store {
            Store::States { states, .. } => states
                .get(group)
                .ok_or_else(|| self.no_group(group))?
                .encode_into(out),
            _ => self.state(group)?.encode_into(out),
        }
        Ok(())
    }
}

/// Group `group`'s slot of a store.
fn slot<T>(v: &mut [T], group: usize) -> Result<&mut T> {
    let groups = v.len();
    v.get_mut(group).ok_or(Error::NoGroup { group, groups })
}

/// Folds `x` into an integer extreme that wants `want`.
fn fold_int(current: &mut Option<i64>, x: i64, want: Ordering) {
    *current = Some(match *current {
        None => x,
        Some(c) if x.cmp(&c) == want => x,
        Some(c) => c,
    });
}
