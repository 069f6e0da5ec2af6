//! [`GroupIndex`]: where an aggregate scan finds the group of a (time
//! bucket, group-tag id) key.
//!
//! Rows reach an aggregate in series order, and within a series in time
//! order, so each tag id's buckets mostly come one after another. Each tag
//! id keeps its groups in a dense run of slots, one per bucket from a base,
//! as long as at least a quarter of the slots are used; keys that would make
//! a run sparser than that go to a hash map. Finding or adding a group is
//! then an index into a vector nearly always, and memory stays within a few
//! slots per group.

use rustc_hash::FxHashMap;
use strength_reduce::StrengthReducedU64;

/// A group key: the bucket start (0 when not bucketed) and the group-tag id.
pub type GroupKey = (i64, u32);

const EMPTY: u32 = u32::MAX;

/// Slack a run may have beyond four slots per group it holds.
const SLACK_SLOTS: usize = 8;

/// One tag id's dense run: `slots[i]` holds the group of bucket
/// `base + i * width`, or `EMPTY`.
#[derive(Debug, Default)]
struct Run {
    base: i64,
    slots: Vec<u32>,
    filled: usize,
}

#[derive(Debug)]
pub struct GroupIndex {
    /// Bucket width in ns; buckets of one plan are all `origin + k * width`.
    /// 0 when not bucketed (every bucket is 0).
    width: i64,
    /// `width` as a divisor by multiplication (the index divides by the
    /// width for every new group); `None` when not bucketed.
    divisor: Option<StrengthReducedU64>,
    runs: Vec<Run>,
    sparse: FxHashMap<GroupKey, u32>,
}

impl GroupIndex {
    pub fn new(width_ns: i64) -> Self {
        let width = width_ns.max(0);
        GroupIndex {
            width,
            divisor: u64::try_from(width)
                .ok()
                .filter(|&w| w > 0)
                .map(StrengthReducedU64::new),
            runs: Vec::new(),
            sparse: FxHashMap::default(),
        }
    }

    /// The slot of `bucket` in a run based at `base`, if it is on the run's
    /// grid (possibly before or past its ends).
    fn offset(&self, base: i64, bucket: i64) -> Option<i128> {
        if self.width == 0 {
            return (bucket == base).then_some(0);
        }
        // In i64 unless the difference overflows it; a bucket at or after
        // the base (the usual case) by multiplication.
        if let Some(d) = bucket.checked_sub(base) {
            if let (Ok(d), Some(divisor)) = (u64::try_from(d), self.divisor) {
                let (q, r) = StrengthReducedU64::div_rem(d, divisor);
                return (r == 0).then_some(i128::from(q));
            }
            return (d % self.width == 0).then_some(i128::from(d / self.width));
        }
        let (d, w) = (
            i128::from(bucket) - i128::from(base),
            i128::from(self.width),
        );
        (d % w == 0).then_some(d / w)
    }

    pub fn get(&self, key: GroupKey) -> Option<u32> {
        let (bucket, tag) = key;
        if let Some(run) = self.runs.get(tag as usize)
            && !run.slots.is_empty()
            && let Some(off) = self.offset(run.base, bucket)
            && let Ok(i) = usize::try_from(off)
            && let Some(&g) = run.slots.get(i)
            && g != EMPTY
        {
            return Some(g);
        }
        if self.sparse.is_empty() {
            return None;
        }
        self.sparse.get(&key).copied()
    }

    /// Records `group` for `key`, which must not be in the index yet.
    pub fn insert(&mut self, key: GroupKey, group: u32) {
        if group == EMPTY || !self.insert_dense(key, group) {
            self.sparse.insert(key, group);
        }
    }

    /// Puts `key` in its tag's run when the run stays dense enough.
    fn insert_dense(&mut self, key: GroupKey, group: u32) -> bool {
        let (bucket, tag) = key;
        let tag = tag as usize;
        if self.runs.len() <= tag {
            // Tag ids are handed out densely from 0.
            self.runs.resize_with(tag + 1, Run::default);
        }
        if self.runs[tag].slots.is_empty() {
            let run = &mut self.runs[tag];
            run.base = bucket;
            run.slots.push(group);
            run.filled = 1;
            return true;
        }
        let (base, len, filled) = {
            let run = &self.runs[tag];
            (run.base, run.slots.len(), run.filled)
        };
        let Some(off) = self.offset(base, bucket) else {
            return false;
        };
        let limit = 4 * (filled + 1) + SLACK_SLOTS;
        if off >= 0 {
            let Ok(i) = usize::try_from(off) else {
                return false;
            };
            if i >= len && i >= limit {
                return false;
            }
            let run = &mut self.runs[tag];
            if i >= len {
                run.slots.resize(i + 1, EMPTY);
            }
            run.slots[i] = group;
        } else {
            // Before the run: grow it at the front by at least its length
            // (so a run walked backwards is not shifted once per bucket).
            let Ok(need) = usize::try_from(-off) else {
                return false;
            };
            let wide = need.max(len);
            let Some((grow, new_base)) = [wide, need]
                .into_iter()
                .find_map(|n| Some((n, self.grid_before(base, n)?)))
            else {
                return false;
            };
            if len + grow > limit {
                return false;
            }
            let run = &mut self.runs[tag];
            run.slots.splice(0..0, std::iter::repeat_n(EMPTY, grow));
            run.base = new_base;
            run.slots[grow - need] = group;
        }
        self.runs[tag].filled += 1;
        true
    }

    /// The bucket `n` steps before `base`, if it is an i64.
    fn grid_before(&self, base: i64, n: usize) -> Option<i64> {
        let n = i64::try_from(n).ok()?;
        base.checked_sub(n.checked_mul(self.width)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever order keys arrive in, the index finds exactly the groups
        /// a plain hash map of the same inserts finds.
        #[test]
        fn finds_what_a_plain_map_finds(
            width in prop_oneof![Just(0i64), Just(1), Just(60), 1i64..1_000, Just(i64::MAX)],
            keys in prop::collection::vec(
                (prop_oneof![-50i64..50, any::<i64>(), Just(i64::MIN), Just(i64::MAX)], 0u32..6),
                0..300,
            ),
            ascending in any::<bool>(),
        ) {
            let mut keys: Vec<GroupKey> = keys
                .into_iter()
                .map(|(k, tag)| (if width == 0 { 0 } else { k.saturating_mul(width.min(1_000)) }, tag))
                .collect();
            if ascending {
                keys.sort_by_key(|&(b, t)| (t, b));
            }
            let mut index = GroupIndex::new(width);
            let mut model: HashMap<GroupKey, u32> = HashMap::new();
            for key in keys {
                let found = index.get(key);
                prop_assert_eq!(found, model.get(&key).copied(), "key {:?}", key);
                if found.is_none() {
                    let g = model.len() as u32;
                    model.insert(key, g);
                    index.insert(key, g);
                }
            }
            for (key, g) in &model {
                prop_assert_eq!(index.get(*key), Some(*g));
            }
        }
    }

    #[test]
    fn series_in_time_order_stay_dense_and_scattered_keys_go_sparse() {
        let mut index = GroupIndex::new(60);
        let mut g = 0;
        for tag in 0..10u32 {
            for minute in 0..1440i64 {
                index.insert((minute * 60, tag), g);
                g += 1;
            }
        }
        assert!(index.sparse.is_empty());
        assert_eq!(index.get((600, 3)), Some(3 * 1440 + 10));
        // Walked backwards: still dense, by growing at the front.
        for minute in (0..1440i64).rev() {
            index.insert((minute * 60, 10), g);
            g += 1;
        }
        assert!(index.sparse.is_empty());
        assert!(index.runs[10].slots.len() < 2 * 1440);
        // One bucket a day apart at minute width: far too sparse for a run.
        for day in 1..5i64 {
            index.insert((day * 86_400 * 60, 11), g);
            g += 1;
        }
        assert_eq!(index.sparse.len(), 3);
        assert_eq!(index.get((2 * 86_400 * 60, 11)), Some(g - 3));
    }
}
