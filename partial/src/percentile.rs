//! The `percentile` state: a t-digest (the `tdigest` crate, compression
//! [`TDIGEST_MAX_SIZE`] = 100 centroids as DataFusion's
//! `approx_percentile_cont` uses) over the finite inputs, and plain counts of
//! `-inf`, `+inf` and NaN beside it. The digest only takes finite values;
//! keeping the others as counts also makes them exact: a quantile that falls
//! among the infinities answers an infinity, not an interpolation.
//!
//! Order of the whole input: `-inf` < finite values < `+inf` < NaN (NaN
//! greatest, as in [`crate::Value`]'s order). Integers are converted to
//! `f64` (past 2^53 they round).
//!
//! Accuracy, as a rank error (the share of inputs between the answer and the
//! true quantile): the digest's scale function lets no centroid hold more
//! than about 2/100 of the finite values (less towards the tails), and an
//! interpolated answer is off by at most about one centroid on either side.
//! The tests hold every answer, after any split and merge tree, to 5% plus
//! one value; the worst seen over random splits was 2.9%, on inputs with few
//! distinct values, and under 1% on 100,000 distinct values.
//!
//! Values are buffered (up to 5 × 100) and folded into the digest in sorted
//! batches, as the crate's own `push` does; the digest proper is always
//! flushed, so the crate never sees a half-built digest.

use std::borrow::Cow;

use tdigest::{Centroid, TDigest};

use crate::error::{Error, Result};

/// The t-digest's compression: at most this many centroids.
pub const TDIGEST_MAX_SIZE: usize = 100;
const PENDING_MAX: usize = 5 * TDIGEST_MAX_SIZE;
/// Centroid weights are counts kept in `f64`: exact up to 2^53.
pub(crate) const MAX_FINITE_COUNT: u64 = 1 << 53;

#[derive(Debug, Clone)]
pub(crate) struct Percentile {
    digest: TDigest,
    pending: Vec<f64>,
    pub(crate) neg_inf: u64,
    pub(crate) pos_inf: u64,
    pub(crate) nan: u64,
}

impl Default for Percentile {
    fn default() -> Self {
        Percentile {
            digest: TDigest::new_with_size(TDIGEST_MAX_SIZE),
            pending: Vec::new(),
            neg_inf: 0,
            pos_inf: 0,
            nan: 0,
        }
    }
}

/// A flushed digest as the byte form holds it.
pub(crate) struct DigestParts {
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// (mean, weight), sorted as the digest sorts them.
    pub(crate) centroids: Vec<(f64, u64)>,
}

impl Percentile {
    pub(crate) fn add(&mut self, x: f64) -> Result<()> {
        if x.is_nan() {
            self.nan = bump(self.nan, 1)?;
        } else if x == f64::INFINITY {
            self.pos_inf = bump(self.pos_inf, 1)?;
        } else if x == f64::NEG_INFINITY {
            self.neg_inf = bump(self.neg_inf, 1)?;
        } else {
            if self.finite_count() >= MAX_FINITE_COUNT {
                return Err(Error::CounterOverflow("percentile"));
            }
            // One zero: the digest compares means with `==` and `total_cmp`,
            // and -0.0 would make its result depend on input order.
            self.pending.push(if x == 0.0 { 0.0 } else { x });
            if self.pending.len() >= PENDING_MAX {
                let pending = std::mem::take(&mut self.pending);
                self.digest = self.digest.merge_unsorted(pending);
            }
        }
        Ok(())
    }

    pub(crate) fn merge(&mut self, other: &Percentile) -> Result<()> {
        let neg_inf = bump(self.neg_inf, other.neg_inf)?;
        let pos_inf = bump(self.pos_inf, other.pos_inf)?;
        let nan = bump(self.nan, other.nan)?;
        if self.finite_count().saturating_add(other.finite_count()) > MAX_FINITE_COUNT {
            return Err(Error::CounterOverflow("percentile"));
        }
        let mine = self.flushed().into_owned();
        let theirs = other.flushed();
        self.digest = if theirs.is_empty() {
            mine
        } else if mine.is_empty() {
            theirs.into_owned()
        } else {
            TDigest::merge_digests(vec![mine, theirs.into_owned()])
        };
        self.pending.clear();
        self.neg_inf = neg_inf;
        self.pos_inf = pos_inf;
        self.nan = nan;
        Ok(())
    }

    fn finite_count(&self) -> u64 {
        self.digest.count() as u64 + self.pending.len() as u64
    }

    /// The digest with the buffered values folded in.
    fn flushed(&self) -> Cow<'_, TDigest> {
        if self.pending.is_empty() {
            Cow::Borrowed(&self.digest)
        } else {
            Cow::Owned(self.digest.merge_unsorted(self.pending.clone()))
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.finite_count() == 0 && self.neg_inf == 0 && self.pos_inf == 0 && self.nan == 0
    }

    /// The estimate at `q` (checked to be in `[0, 1]` by the caller) over the
    /// whole input, or None with no input.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let digest = self.flushed();
        let finite = digest.count() as u64;
        let parts = [
            (self.neg_inf, Some(f64::NEG_INFINITY)),
            (finite, None),
            (self.pos_inf, Some(f64::INFINITY)),
            (self.nan, Some(f64::NAN)),
        ];
        let total: f64 = parts.iter().map(|(n, _)| *n as f64).sum();
        let last = parts.iter().rposition(|(n, _)| *n > 0)?;
        let rank = q * total;
        let mut before = 0.0;
        for (i, (n, special)) in parts.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            let n = *n as f64;
            if rank < before + n || i == last {
                return match special {
                    Some(v) => Some(*v),
                    None => digest.estimate_quantile(((rank - before) / n).clamp(0.0, 1.0)),
                };
            }
            before += n;
        }
        None
    }

    /// The flushed digest for encoding; None when it holds no value.
    pub(crate) fn parts(&self) -> Option<DigestParts> {
        let digest = self.flushed();
        let (min, max) = (digest.min()?, digest.max()?);
        let centroids = digest
            .centroids()
            .iter()
            .map(|c| (c.mean(), c.weight() as u64))
            .collect();
        Some(DigestParts {
            min,
            max,
            centroids,
        })
    }

    /// Rebuilds a state from decoded parts, checking every invariant the
    /// `tdigest` crate relies on (it asserts some and indexes on others).
    pub(crate) fn from_parts(
        digest: Option<DigestParts>,
        neg_inf: u64,
        pos_inf: u64,
        nan: u64,
    ) -> Result<Percentile> {
        let mut state = Percentile {
            neg_inf,
            pos_inf,
            nan,
            ..Percentile::default()
        };
        let Some(parts) = digest else {
            return Ok(state);
        };
        let (min, max) = (parts.min, parts.max);
        if !(min.is_finite() && max.is_finite() && min <= max) {
            return Err(Error::Corrupt(
                "percentile bounds are not finite and ordered",
            ));
        }
        if parts.centroids.is_empty() || parts.centroids.len() > TDIGEST_MAX_SIZE {
            return Err(Error::Corrupt("percentile centroid count out of range"));
        }
        let mut count: u64 = 0;
        let mut sum = 0.0;
        let mut centroids = Vec::with_capacity(parts.centroids.len());
        for (mean, weight) in parts.centroids {
            if !(mean.is_finite() && min <= mean && mean <= max) {
                return Err(Error::Corrupt(
                    "percentile centroid mean outside the bounds",
                ));
            }
            if weight == 0 {
                return Err(Error::Corrupt("percentile centroid of zero weight"));
            }
            count = count
                .checked_add(weight)
                .filter(|c| *c <= MAX_FINITE_COUNT)
                .ok_or(Error::Corrupt("percentile count over 2^53"))?;
            sum += mean * weight as f64;
            centroids.push(Centroid::new(mean, weight as f64));
        }
        if centroids.windows(2).any(|pair| pair[0] > pair[1]) {
            return Err(Error::Corrupt("percentile centroids out of order"));
        }
        state.digest = TDigest::new(
            centroids,
            sum,
            count as f64,
            Some(max),
            Some(min),
            TDIGEST_MAX_SIZE,
        );
        Ok(state)
    }
}

fn bump(a: u64, b: u64) -> Result<u64> {
    a.checked_add(b).ok_or(Error::CounterOverflow("percentile"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn percentile_of(values: &[f64]) -> Percentile {
        let mut p = Percentile::default();
        for v in values {
            assert_eq!(p.add(*v), Ok(()));
        }
        p
    }

    #[test]
    fn median_of_a_range_is_close() {
        let values: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let p = percentile_of(&values);
        let median = p.quantile(0.5).unwrap_or(f64::NAN);
        assert!((median - 5000.0).abs() < 100.0, "{median}");
        assert_eq!(p.quantile(0.0), Some(1.0));
        assert_eq!(p.quantile(1.0), Some(10_000.0));
    }

    #[test]
    fn infinities_and_nan_take_their_ranks() {
        let p = percentile_of(&[f64::NEG_INFINITY, 1.0, 2.0, f64::INFINITY, f64::NAN]);
        assert_eq!(p.quantile(0.0), Some(f64::NEG_INFINITY));
        assert_eq!(p.quantile(0.7), Some(f64::INFINITY));
        assert!(p.quantile(1.0).is_some_and(f64::is_nan));
        let mid = p.quantile(0.3).unwrap_or(f64::NAN);
        assert!((1.0..=2.0).contains(&mid), "{mid}");
    }

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(Percentile::default().quantile(0.5), None);
    }
}
