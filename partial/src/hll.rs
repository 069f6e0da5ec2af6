//! HyperLogLog for `approx_distinct`: 2^14 registers (precision 14, as
//! DataFusion uses), written here rather than taken from a crate because we
//! need the registers for our own byte layout and no well-kept HLL crate gives
//! them out. Only the register array is ours to get right; the estimator is
//! Ertl's improved raw estimator ("New cardinality estimation algorithms for
//! HyperLogLog sketches", 2017), the one DataFusion's `approx_distinct` uses.
//! It needs no bias tables and handles the small range (where it reduces to
//! linear counting) and the large range in one formula.
//!
//! The hash must be the same in every process and on every machine, or states
//! from two nodes would not merge: XXH64 (a frozen, specified algorithm) with
//! the fixed seed [`HLL_HASH_SEED`] over the value's canonical bytes
//! (integers as 8 little-endian bytes, floats as the bits of the value with
//! one NaN and one zero, booleans as one byte, text as its UTF-8 bytes).
//! Changing the seed, the hash or the bytes is a new format version.
//!
//! Must never: use a randomly seeded hasher.

use twox_hash::XxHash64;

use crate::value::{Value, distinct_f64_bits};

/// Bits of the hash that pick the register.
pub const HLL_PRECISION: u8 = 14;
pub(crate) const REGISTERS: usize = 1 << HLL_PRECISION;
/// Bits of the hash left to count zeros in.
const Q: u32 = 64 - HLL_PRECISION as u32;
/// The largest value a register can take.
pub(crate) const MAX_REGISTER: u8 = Q as u8 + 1;
/// The seed of the XXH64 hash of values; part of the format.
pub const HLL_HASH_SEED: u64 = 0x5ea1_1011_0000_0001;

/// The registers, or nothing while all are zero (an empty state costs no
/// 16 KiB).
#[derive(Clone, Default, PartialEq)]
pub(crate) struct Hll {
    registers: Vec<u8>,
}

impl std::fmt::Debug for Hll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hll")
            .field("non_zero_registers", &self.non_zero())
            .field("estimate", &self.estimate())
            .finish()
    }
}

/// The hash of a value as `approx_distinct` sees it.
pub(crate) fn hash_value(value: &Value) -> u64 {
    match value {
        Value::F64(f) => XxHash64::oneshot(HLL_HASH_SEED, &distinct_f64_bits(*f).to_le_bytes()),
        Value::I64(i) => XxHash64::oneshot(HLL_HASH_SEED, &i.to_le_bytes()),
        Value::U64(u) => XxHash64::oneshot(HLL_HASH_SEED, &u.to_le_bytes()),
        Value::Bool(b) => XxHash64::oneshot(HLL_HASH_SEED, &[u8::from(*b)]),
        Value::Str(s) => XxHash64::oneshot(HLL_HASH_SEED, s.as_bytes()),
    }
}

impl Hll {
    pub(crate) fn add_hash(&mut self, hash: u64) {
        let index = (hash & (REGISTERS as u64 - 1)) as usize;
        // The sentinel bit bounds the run of zeros at Q, so rho <= Q + 1.
        let rho = ((hash >> HLL_PRECISION) | (1 << Q)).trailing_zeros() as u8 + 1;
        let registers = self.registers_mut();
        if let Some(r) = registers.get_mut(index) {
            *r = (*r).max(rho);
        }
    }

    pub(crate) fn merge(&mut self, other: &Hll) {
        if other.registers.is_empty() {
            return;
        }
        if self.registers.is_empty() {
            self.registers = other.registers.clone();
            return;
        }
        for (mine, theirs) in self.registers.iter_mut().zip(&other.registers) {
            *mine = (*mine).max(*theirs);
        }
    }

    fn registers_mut(&mut self) -> &mut [u8] {
        if self.registers.is_empty() {
            self.registers = vec![0; REGISTERS];
        }
        &mut self.registers
    }

    /// The registers, all of them, or an empty slice when all are zero.
    pub(crate) fn registers(&self) -> &[u8] {
        &self.registers
    }

    /// Takes registers checked by the decoder: `REGISTERS` of them, each at
    /// most [`MAX_REGISTER`], not all zero. Anything else is refused.
    pub(crate) fn from_registers(registers: Vec<u8>) -> Option<Hll> {
        let valid = registers.len() == REGISTERS
            && registers.iter().all(|r| *r <= MAX_REGISTER)
            && registers.iter().any(|r| *r != 0);
        valid.then_some(Hll { registers })
    }

    pub(crate) fn non_zero(&self) -> usize {
        self.registers.iter().filter(|r| **r != 0).count()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.registers.is_empty()
    }

    /// Ertl's improved raw estimate.
    pub(crate) fn estimate(&self) -> f64 {
        if self.registers.is_empty() {
            return 0.0;
        }
        let mut histogram = [0u32; MAX_REGISTER as usize + 1];
        for r in &self.registers {
            if let Some(slot) = histogram.get_mut(*r as usize) {
                *slot += 1;
            }
        }
        let m = REGISTERS as f64;
        let mut z = m * tau((m - f64::from(histogram[MAX_REGISTER as usize])) / m);
        for count in histogram[1..=Q as usize].iter().rev() {
            z += f64::from(*count);
            z *= 0.5;
        }
        z += m * sigma(f64::from(histogram[0]) / m);
        // alpha_inf = 1 / (2 ln 2)
        const ALPHA_INF: f64 = 0.721_347_520_444_481_7;
        ALPHA_INF * m * m / z
    }
}

/// Ertl's sigma: the correction for registers still at zero (where the
/// estimate becomes linear counting). `x` is the fraction of zero registers.
fn sigma(x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut x = x;
    let mut y = 1.0;
    let mut z = x;
    // x squares towards 0, so z stops changing within ~60 rounds.
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if z == previous {
            return z;
        }
    }
}

/// Ertl's tau: the correction for registers at the maximum. `x` is the
/// fraction of registers below it.
fn tau(x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut x = x;
    let mut y = 1.0;
    let mut z = 1.0 - x;
    // sqrt takes x towards 1 and y halves, so z stops changing.
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x).powi(2) * y;
        if z == previous {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate_of(values: impl Iterator<Item = Value>) -> f64 {
        let mut hll = Hll::default();
        for v in values {
            hll.add_hash(hash_value(&v));
        }
        hll.estimate()
    }

    /// Pins the hash: a change here is a change of the stored format.
    #[test]
    fn hash_is_pinned() {
        assert_eq!(
            XxHash64::oneshot(0, b""),
            0xef46_db37_51d8_e999,
            "XXH64 of the empty input with seed 0 is its published test vector"
        );
        let pinned = [
            hash_value(&Value::I64(1)),
            hash_value(&Value::Str("cpu".into())),
            hash_value(&Value::F64(-0.0)),
        ];
        assert_eq!(pinned, PINNED_HASHES);
        assert_eq!(hash_value(&Value::F64(-0.0)), hash_value(&Value::F64(0.0)));
    }

    const PINNED_HASHES: [u64; 3] = [
        13_397_923_321_759_682_485,
        13_912_468_091_043_170_919,
        6_892_745_285_043_506_951,
    ];

    #[test]
    fn empty_estimates_zero() {
        assert_eq!(Hll::default().estimate(), 0.0);
    }

    #[test]
    fn small_sets_are_counted_almost_exactly() {
        for n in [1_i64, 2, 10, 100, 1000] {
            let est = estimate_of((0..n).map(Value::I64));
            assert!(
                (est - n as f64).abs() <= 1.0 + 0.01 * n as f64,
                "n={n} est={est}"
            );
        }
    }

    #[test]
    fn large_sets_are_within_two_percent() {
        for n in [10_000_i64, 100_000, 1_000_000] {
            let est = estimate_of((0..n).map(Value::I64));
            let rel = (est - n as f64).abs() / n as f64;
            assert!(rel < 0.02, "n={n} est={est} rel={rel}");
        }
        let est = estimate_of((0..200_000).map(|i| Value::Str(format!("host-{i}"))));
        let rel = (est - 200_000.0).abs() / 200_000.0;
        assert!(rel < 0.02, "est={est} rel={rel}");
    }

    #[test]
    fn register_values_stay_within_bounds() {
        let mut hll = Hll::default();
        hll.add_hash(0);
        hll.add_hash(u64::MAX);
        assert!(hll.registers().iter().all(|r| *r <= MAX_REGISTER));
        assert_eq!(hll.registers()[0], MAX_REGISTER);
    }
}
