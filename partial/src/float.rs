//! The float accumulators: a compensated sum for `sum`/`avg` over `F64`, and
//! Welford's moments with Chan's merge for `variance`.
//!
//! Both keep `+inf`, `-inf` and NaN out of the arithmetic and only remember
//! that they were seen, so that the special results do not depend on the
//! order of rows or merges (`inf + -inf` is NaN whichever came first). What
//! stays order-dependent is the last bits of finite results, and an overflow
//! of the finite sum itself (finite values whose sum passes `f64::MAX`).
//!
//! Both merges are written so that `a ⊕ b` and `b ⊕ a` give the same bits.

/// Flag bits of [`FloatSum::specials`].
pub(crate) const SEEN_POS_INF: u8 = 1;
pub(crate) const SEEN_NEG_INF: u8 = 2;
pub(crate) const SEEN_NAN: u8 = 4;
pub(crate) const SEEN_ALL: u8 = SEEN_POS_INF | SEEN_NEG_INF | SEEN_NAN;

/// Neumaier's compensated sum of the finite inputs, plus which non-finite
/// inputs were seen.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct FloatSum {
    pub(crate) sum: f64,
    /// The low-order bits lost by `sum`; zero once `sum` is not finite.
    pub(crate) compensation: f64,
    pub(crate) specials: u8,
}

impl FloatSum {
    pub(crate) fn add(&mut self, x: f64) {
        if x.is_nan() {
            self.specials |= SEEN_NAN;
        } else if x == f64::INFINITY {
            self.specials |= SEEN_POS_INF;
        } else if x == f64::NEG_INFINITY {
            self.specials |= SEEN_NEG_INF;
        } else {
            self.add_parts(x, 0.0);
        }
    }

    /// Adds each of `values` in turn: the same bits as [`FloatSum::add`]
    /// value by value. When every value and the sum so far are integers
    /// well inside the range where `f64` is exact, every partial sum is
    /// exact and no step compensates, so the run is summed as integers and
    /// added once (TSBS-like readings are such values).
    pub(crate) fn add_all(&mut self, values: &[f64]) {
        match self.exact_integer_sum(values) {
            Some(total) => self.add_parts(total, 0.0),
            None => values.iter().for_each(|&x| self.add(x)),
        }
    }

    /// The exact sum of `values` when the conditions of
    /// [`FloatSum::add_all`] hold: at most 2^20 values each an integer of
    /// magnitude at most 2^32, and a sum so far that is an integer of
    /// magnitude at most 2^52 (not -0.0, which one by one could stay -0.0).
    /// Every partial sum is then an integer below 2^53.
    fn exact_integer_sum(&self, values: &[f64]) -> Option<f64> {
        // `(x + MAGIC) - MAGIC` is `x` rounded to an integer for |x| < 2^51.
        const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
        const VALUE_BOUND: f64 = 4_294_967_296.0; // 2^32
        if values.is_empty() || values.len() > 1 << 20 {
            return None;
        }
        let s = self.sum as i64;
        if s as f64 != self.sum
            || s.unsigned_abs() > 1 << 52
            || self.sum.is_sign_negative() && s == 0
        {
            return None;
        }
        // Sums of such integers are exact in any order: four lanes, checked
        // and added without a branch. (A NaN fails `r == x`; an infinity
        // fails the bound; what a failing lane adds does not matter.)
        let fits = |x: f64| ((x + MAGIC) - MAGIC == x) & (x.abs() <= VALUE_BOUND);
        let mut exact = [true; 4];
        let mut sums = [0.0f64; 4];
        let lanes = values.chunks_exact(4);
        let rest = lanes.remainder();
        for chunk in lanes {
            for l in 0..4 {
                exact[l] &= fits(chunk[l]);
                sums[l] += chunk[l];
            }
        }
        for &x in rest {
            exact[0] &= fits(x);
            sums[0] += x;
        }
        let total = (sums[0] + sums[1]) + (sums[2] + sums[3]);
        (exact == [true; 4]).then_some(total)
    }

    pub(crate) fn merge(&mut self, other: &FloatSum) {
        self.specials |= other.specials;
        self.add_parts(other.sum, other.compensation);
    }

    /// Adds a (sum, compensation) pair. Symmetric in its operands: the
    /// branch on magnitudes picks the same error term from either side.
    fn add_parts(&mut self, sum: f64, compensation: f64) {
        let total = self.sum + sum;
        if !total.is_finite() {
            // The finite values overflowed; the compensation means nothing now.
            self.sum = total;
            self.compensation = 0.0;
            return;
        }
        let error = if self.sum.abs() >= sum.abs() {
            (self.sum - total) + sum
        } else {
            (sum - total) + self.sum
        };
        self.compensation = (self.compensation + compensation) + error;
        self.sum = total;
    }

    /// The sum, with the special values taking over as IEEE arithmetic would
    /// have them (NaN if NaN or both infinities were seen).
    pub(crate) fn value(&self) -> f64 {
        let pos = self.specials & SEEN_POS_INF != 0;
        let neg = self.specials & SEEN_NEG_INF != 0;
        if self.specials & SEEN_NAN != 0 || (pos && neg) {
            f64::NAN
        } else if pos {
            f64::INFINITY
        } else if neg {
            f64::NEG_INFINITY
        } else if !self.sum.is_finite() {
            self.sum
        } else {
            self.sum + self.compensation
        }
    }
}

/// Count, mean and sum of squared deviations of the finite inputs (Welford),
/// plus how many inputs were not finite.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Moments {
    pub(crate) count: u64,
    pub(crate) mean: f64,
    pub(crate) m2: f64,
    pub(crate) non_finite: u64,
}

impl Moments {
    pub(crate) fn add(&mut self, x: f64) -> crate::Result<()> {
        if !x.is_finite() {
            self.non_finite = checked(self.non_finite.checked_add(1), "variance")?;
            return Ok(());
        }
        self.count = checked(self.count.checked_add(1), "variance")?;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
        Ok(())
    }

    /// Chan et al.'s parallel combination, in a form whose result does not
    /// depend on which side is `self`.
    pub(crate) fn merge(&mut self, other: &Moments) -> crate::Result<()> {
        let non_finite = checked(self.non_finite.checked_add(other.non_finite), "variance")?;
        let count = checked(self.count.checked_add(other.count), "variance")?;
        self.non_finite = non_finite;
        if other.count == 0 {
            return Ok(());
        }
        if self.count == 0 {
            self.count = other.count;
            self.mean = other.mean;
            self.m2 = other.m2;
            return Ok(());
        }
        let (na, nb, n) = (self.count as f64, other.count as f64, count as f64);
        let delta = other.mean - self.mean;
        self.mean = self.mean * (na / n) + other.mean * (nb / n);
        self.m2 = (self.m2 + other.m2) + delta * delta * (na * nb / n);
        self.count = count;
        Ok(())
    }

    /// `m2` over `n - ddof`, or None when there are too few values. Any
    /// infinite or NaN input makes the result NaN.
    pub(crate) fn variance(&self, ddof: u64) -> Option<f64> {
        let total = self.count.saturating_add(self.non_finite);
        if total == 0 || total <= ddof {
            return None;
        }
        if self.non_finite > 0 {
            return Some(f64::NAN);
        }
        Some(self.m2 / (self.count - ddof) as f64)
    }
}

fn checked(v: Option<u64>, what: &'static str) -> crate::Result<u64> {
    v.ok_or(crate::Error::CounterOverflow(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compensated_sum_keeps_small_terms_next_to_large_ones() {
        let mut s = FloatSum::default();
        for x in [1e16, 1.0, -1e16, 1.0] {
            s.add(x);
        }
        assert_eq!(s.value(), 2.0);
    }

    #[test]
    fn both_infinities_give_nan_in_any_order() {
        for xs in [
            [f64::INFINITY, f64::NEG_INFINITY],
            [f64::NEG_INFINITY, f64::INFINITY],
        ] {
            let mut s = FloatSum::default();
            for x in xs {
                s.add(x);
            }
            assert!(s.value().is_nan());
        }
    }

    #[test]
    fn float_sum_merge_is_bitwise_commutative() {
        let mut a = FloatSum::default();
        let mut b = FloatSum::default();
        for x in [0.1, 0.2, 1e10, -3.5] {
            a.add(x);
        }
        for x in [1e-7, 7.25, -1e10] {
            b.add(x);
        }
        let mut ab = a;
        ab.merge(&b);
        let mut ba = b;
        ba.merge(&a);
        assert_eq!(ab.sum.to_bits(), ba.sum.to_bits());
        assert_eq!(ab.compensation.to_bits(), ba.compensation.to_bits());
    }

    #[test]
    fn moments_match_two_pass_variance() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        let mut m = Moments::default();
        for x in xs {
            assert_eq!(m.add(x), Ok(()));
        }
        assert_eq!(m.variance(0), Some(4.0));
        let mut left = Moments::default();
        let mut right = Moments::default();
        for x in &xs[..3] {
            assert_eq!(left.add(*x), Ok(()));
        }
        for x in &xs[3..] {
            assert_eq!(right.add(*x), Ok(()));
        }
        assert_eq!(left.merge(&right), Ok(()));
        let merged = left.variance(0).unwrap_or(f64::NAN);
        assert!((merged - 4.0).abs() < 1e-12, "{merged}");
    }
}
