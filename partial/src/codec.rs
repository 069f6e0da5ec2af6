//! The byte form of a [`State`]: what storage nodes send to query nodes and
//! what rollups will store, so it is ours, versioned, and read as untrusted.
//!
//! # Layout, version 1
//!
//! All integers are fixed-width little-endian; an `f64` is its IEEE-754 bits
//! as a `u64`. A state is exactly these bytes: nothing may follow.
//!
//! ```text
//! u8  format version (1)
//! u8  kind: 1 count, 2 sum, 3 min, 4 max, 5 avg, 6 first, 7 last,
//!           8 variance, 9 percentile, 10 approx_distinct, 11 count(DISTINCT)
//! u8  input type: 1 F64, 2 I64, 3 U64, 4 Bool, 5 Str
//! body, by kind:
//!   count                    u64 count
//!   sum, avg over I64        u64 count, i128 sum
//!   sum, avg over U64        u64 count, u128 sum
//!   sum, avg over F64        u64 count, f64 sum, f64 compensation,
//!                            u8 seen (bit 0 +inf, 1 -inf, 2 NaN)
//!   min, max                 u8 present (0|1), [value]
//!   first, last              u8 present (0|1), [i64 time_ns, value]
//!   variance                 u64 count (finite), f64 mean, f64 m2,
//!                            u64 non-finite count
//!   percentile               u64 -inf count, u64 +inf count, u64 NaN count,
//!                            u32 centroids (0..=100); if any:
//!                            f64 min, f64 max, then per centroid
//!                            f64 mean, u64 weight (sorted by mean, weight)
//!   approx_distinct          u8 precision (14), u8 form:
//!                            0 sparse: u32 n (<= 5459), n × (u16 register,
//!                              u8 value), registers strictly increasing;
//!                            1 dense: 16384 × u8 value, more than 5459 non-zero
//!   count(DISTINCT)          u32 n (<= 1,000,000), n values strictly increasing
//! value, by input type:
//!   F64 8 bytes (NaN only as the canonical quiet NaN), I64 8, U64 8,
//!   Bool 1 (0|1), Str u32 length (<= 16 MiB) + UTF-8 bytes
//!   in count(DISTINCT): F64 as the u64 bits of the value with one zero and
//!   one NaN, ordered as u64; text ordered by bytes; at most 128 MiB of text
//! ```
//!
//! Every state has exactly one encoding: the decoder refuses anything the
//! encoder would not write (non-canonical NaN, an empty state with non-zero
//! fields, a dense HLL that should be sparse, unsorted or repeated set
//! members), so `encode(decode(b)) == b` whenever `decode(b)` succeeds, and
//! equal states can be compared by their bytes. The HLL's sparse form is
//! used while `4 + 3n` bytes are fewer than the 16384 of the dense one.
//!
//! The decoder never panics, checks every length against the bytes that
//! remain before it allocates, and refuses trailing bytes, unknown versions,
//! kinds and types, and invalid UTF-8. A container that holds states (a Flight
//! batch, a rollup file) carries its own magic and checksum; this layout is
//! the value inside.
//!
//! Must never: change meaning without a new version byte.

use crate::distinct::{Distinct, MAX_DISTINCT_BYTES, MAX_DISTINCT_VALUES};
use crate::error::{Error, Result};
use crate::float::{FloatSum, Moments, SEEN_ALL};
use crate::hll::{HLL_PRECISION, Hll, MAX_REGISTER, REGISTERS};
use crate::kind::AggregateKind;
use crate::percentile::{DigestParts, Percentile, TDIGEST_MAX_SIZE};
use crate::state::{Body, MAX_STRING_BYTES, State};
use crate::value::{CANONICAL_NAN_BITS, Value, ValueType};

/// The version this build writes and the only one it reads.
pub const FORMAT_VERSION: u8 = 1;

const HLL_SPARSE: u8 = 0;
const HLL_DENSE: u8 = 1;
/// The most non-zero registers the sparse form holds: `4 + 3n < 16384`.
const HLL_SPARSE_MAX: usize = (REGISTERS - 4 - 1) / 3;

impl State {
    /// The state's bytes (see the module doc for the layout).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        self.encode_into(&mut out);
        out
    }

    /// Appends the state's bytes to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[FORMAT_VERSION, self.kind.code(), self.input.code()]);
        match &self.body {
            Body::Count(n) => put_u64(out, *n),
            Body::IntSum { count, sum } => {
                put_u64(out, *count);
                out.extend_from_slice(&sum.to_le_bytes());
            }
            Body::UintSum { count, sum } => {
                put_u64(out, *count);
                out.extend_from_slice(&sum.to_le_bytes());
            }
            Body::FloatSum { count, sum } => {
                put_u64(out, *count);
                put_f64(out, sum.sum);
                put_f64(out, sum.compensation);
                out.push(sum.specials);
            }
            Body::Extreme(v) => match v {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    put_value(out, v);
                }
            },
            Body::Timed(v) => match v {
                None => out.push(0),
                Some((t, v)) => {
                    out.push(1);
                    out.extend_from_slice(&t.to_le_bytes());
                    put_value(out, v);
                }
            },
            Body::Moments(m) => {
                put_u64(out, m.count);
                put_f64(out, m.mean);
                put_f64(out, m.m2);
                put_u64(out, m.non_finite);
            }
            Body::Percentile(p) => {
                put_u64(out, p.neg_inf);
                put_u64(out, p.pos_inf);
                put_u64(out, p.nan);
                match p.parts() {
                    None => put_u32(out, 0),
                    Some(parts) => {
                        put_len(out, parts.centroids.len());
                        put_f64(out, parts.min);
                        put_f64(out, parts.max);
                        for (mean, weight) in parts.centroids {
                            put_f64(out, mean);
                            put_u64(out, weight);
                        }
                    }
                }
            }
            Body::Hll(h) => {
                out.push(HLL_PRECISION);
                let non_zero = h.non_zero();
                if non_zero <= HLL_SPARSE_MAX {
                    out.push(HLL_SPARSE);
                    put_len(out, non_zero);
                    for (i, r) in h.registers().iter().enumerate() {
                        if *r != 0 {
                            out.extend_from_slice(&(i as u16).to_le_bytes());
                            out.push(*r);
                        }
                    }
                } else {
                    out.push(HLL_DENSE);
                    out.extend_from_slice(h.registers());
                }
            }
            Body::Distinct(d) => {
                put_len(out, d.len());
                match d {
                    Distinct::F64(s) | Distinct::U64(s) => s.iter().for_each(|v| put_u64(out, *v)),
                    Distinct::I64(s) => s
                        .iter()
                        .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
                    Distinct::Bool(s) => s.iter().for_each(|v| out.push(u8::from(*v))),
                    Distinct::Str { set, .. } => set.iter().for_each(|v| put_str(out, v)),
                }
            }
        }
    }

    /// Reads a state written by [`State::encode`]. Any other bytes are an
    /// error (see [`Error::is_decode_error`]), never a panic.
    pub fn decode(bytes: &[u8]) -> Result<State> {
        // The commonest state of all, min or max over a float that was
        // seen, read straight; the same answer as the general path below.
        const MIN: u8 = AggregateKind::Min.code();
        const MAX: u8 = AggregateKind::Max.code();
        const F64: u8 = ValueType::F64.code();
        if let [FORMAT_VERSION, kind @ (MIN | MAX), F64, 1, value @ ..] = bytes
            && let Ok(value) = <[u8; 8]>::try_from(value)
        {
            let f = f64::from_le_bytes(value);
            if !f.is_nan() || f.to_bits() == CANONICAL_NAN_BITS {
                let kind = if *kind == MIN {
                    AggregateKind::Min
                } else {
                    AggregateKind::Max
                };
                return Ok(State {
                    kind,
                    input: ValueType::F64,
                    body: Body::Extreme(Some(Value::F64(f))),
                });
            }
        }
        Self::decode_general(bytes)
    }

    /// [`State::decode`] of any state.
    fn decode_general(bytes: &[u8]) -> Result<State> {
        let mut r = Reader { bytes };
        let version = r.u8("format version")?;
        if version != FORMAT_VERSION {
            return Err(Error::UnknownVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let kind = AggregateKind::from_code(r.u8("aggregate kind")?)?;
        let input = ValueType::from_code(r.u8("input type")?)?;
        let mut state = State::new(kind, input)
            .map_err(|_| Error::Corrupt("the aggregate kind does not take the input type"))?;
        state.body = match state.body {
            Body::Count(_) => Body::Count(r.u64("count")?),
            Body::IntSum { .. } => {
                let count = r.u64("count")?;
                let sum = i128::from_le_bytes(r.array("sum")?);
                // |sum| <= count * 2^63 for any real input; keeping it so
                // means later merges cannot overflow.
                let bound = i128::from(count) << 63;
                if sum.unsigned_abs() > bound.unsigned_abs() {
                    return Err(Error::Corrupt("sum larger than its count allows"));
                }
                Body::IntSum { count, sum }
            }
            Body::UintSum { .. } => {
                let count = r.u64("count")?;
                let sum = u128::from_le_bytes(r.array("sum")?);
                if sum > u128::from(count) * u128::from(u64::MAX) {
                    return Err(Error::Corrupt("sum larger than its count allows"));
                }
                Body::UintSum { count, sum }
            }
            Body::FloatSum { .. } => {
                let count = r.u64("count")?;
                let sum = FloatSum {
                    sum: r.f64("sum")?,
                    compensation: r.f64("compensation")?,
                    specials: r.u8("special values")?,
                };
                if sum.specials & !SEEN_ALL != 0 {
                    return Err(Error::Corrupt("unknown special-value flags"));
                }
                if count == 0 && !bitwise_zero(&[sum.sum, sum.compensation]) {
                    return Err(Error::Corrupt("empty sum with non-zero fields"));
                }
                if count == 0 && sum.specials != 0 {
                    return Err(Error::Corrupt("empty sum that saw special values"));
                }
                Body::FloatSum { count, sum }
            }
            Body::Extreme(_) => Body::Extreme(if r.flag("presence")? {
                Some(get_value(&mut r, input)?)
            } else {
                None
            }),
            Body::Timed(_) => Body::Timed(if r.flag("presence")? {
                let time = i64::from_le_bytes(r.array("time")?);
                Some((time, get_value(&mut r, input)?))
            } else {
                None
            }),
            Body::Moments(_) => {
                let m = Moments {
                    count: r.u64("count")?,
                    mean: r.f64("mean")?,
                    m2: r.f64("m2")?,
                    non_finite: r.u64("non-finite count")?,
                };
                if m.count == 0 && !bitwise_zero(&[m.mean, m.m2]) {
                    return Err(Error::Corrupt("empty variance with non-zero fields"));
                }
                if m.count.checked_add(m.non_finite).is_none() {
                    return Err(Error::Corrupt("variance count over u64"));
                }
                Body::Moments(m)
            }
            Body::Percentile(_) => Body::Percentile(Box::new(decode_percentile(&mut r)?)),
            Body::Hll(_) => Body::Hll(decode_hll(&mut r)?),
            Body::Distinct(_) => Body::Distinct(decode_distinct(&mut r, input)?),
        };
        r.finish()?;
        Ok(state)
    }
}

fn decode_percentile(r: &mut Reader<'_>) -> Result<Percentile> {
    let neg_inf = r.u64("-inf count")?;
    let pos_inf = r.u64("+inf count")?;
    let nan = r.u64("NaN count")?;
    let n = r.u32("centroid count")? as usize;
    if n > TDIGEST_MAX_SIZE {
        return Err(Error::Corrupt("more centroids than the digest keeps"));
    }
    let digest = if n == 0 {
        None
    } else {
        let min = r.f64("percentile min")?;
        let max = r.f64("percentile max")?;
        r.ensure(n, 16, "centroids")?;
        let mut centroids = Vec::with_capacity(n);
        for _ in 0..n {
            centroids.push((r.f64("centroid mean")?, r.u64("centroid weight")?));
        }
        Some(DigestParts {
            min,
            max,
            centroids,
        })
    };
    let total = [neg_inf, pos_inf, nan]
        .into_iter()
        .try_fold(0u64, u64::checked_add);
    if total.is_none() {
        return Err(Error::Corrupt("percentile count over u64"));
    }
    Percentile::from_parts(digest, neg_inf, pos_inf, nan)
}

fn decode_hll(r: &mut Reader<'_>) -> Result<Hll> {
    let precision = r.u8("HLL precision")?;
    if precision != HLL_PRECISION {
        return Err(Error::Corrupt("HLL precision other than 14"));
    }
    match r.u8("HLL form")? {
        HLL_SPARSE => {
            let n = r.u32("HLL register count")? as usize;
            if n > HLL_SPARSE_MAX {
                return Err(Error::Corrupt("sparse HLL with too many registers"));
            }
            if n == 0 {
                return Ok(Hll::default());
            }
            r.ensure(n, 3, "HLL registers")?;
            let mut registers = vec![0u8; REGISTERS];
            let mut previous: Option<u16> = None;
            for _ in 0..n {
                let index = u16::from_le_bytes(r.array("HLL register index")?);
                let value = r.u8("HLL register value")?;
                if previous.is_some_and(|p| index <= p) {
                    return Err(Error::Corrupt("sparse HLL registers out of order"));
                }
                if value == 0 || value > MAX_REGISTER {
                    return Err(Error::Corrupt("HLL register value out of range"));
                }
                let slot = registers
                    .get_mut(usize::from(index))
                    .ok_or(Error::Corrupt("HLL register index out of range"))?;
                *slot = value;
                previous = Some(index);
            }
            Hll::from_registers(registers).ok_or(Error::Corrupt("invalid HLL registers"))
        }
        HLL_DENSE => {
            let registers = r.take(REGISTERS, "HLL registers")?.to_vec();
            if registers.iter().filter(|v| **v != 0).count() <= HLL_SPARSE_MAX {
                return Err(Error::Corrupt("dense HLL that the sparse form should hold"));
            }
            Hll::from_registers(registers).ok_or(Error::Corrupt("HLL register value out of range"))
        }
        _ => Err(Error::Corrupt("unknown HLL form")),
    }
}

fn decode_distinct(r: &mut Reader<'_>, input: ValueType) -> Result<Distinct> {
    let n = r.u32("distinct value count")? as usize;
    if n > MAX_DISTINCT_VALUES {
        return Err(Error::Corrupt("more distinct values than a state keeps"));
    }
    let mut d = Distinct::new(input);
    let out_of_order = Error::Corrupt("distinct values not strictly increasing");
    match &mut d {
        Distinct::F64(set) => {
            r.ensure(n, 8, "distinct values")?;
            for _ in 0..n {
                let bits = r.u64("distinct value")?;
                let f = f64::from_bits(bits);
                if (f.is_nan() && bits != CANONICAL_NAN_BITS) || (f == 0.0 && bits != 0) {
                    return Err(Error::Corrupt("non-canonical float in a distinct set"));
                }
                if set.last().is_some_and(|last| bits <= *last) {
                    return Err(out_of_order);
                }
                set.insert(bits);
            }
        }
        Distinct::U64(set) => {
            r.ensure(n, 8, "distinct values")?;
            for _ in 0..n {
                let v = r.u64("distinct value")?;
                if set.last().is_some_and(|last| v <= *last) {
                    return Err(out_of_order);
                }
                set.insert(v);
            }
        }
        Distinct::I64(set) => {
            r.ensure(n, 8, "distinct values")?;
            for _ in 0..n {
                let v = i64::from_le_bytes(r.array("distinct value")?);
                if set.last().is_some_and(|last| v <= *last) {
                    return Err(out_of_order);
                }
                set.insert(v);
            }
        }
        Distinct::Bool(set) => {
            r.ensure(n, 1, "distinct values")?;
            for _ in 0..n {
                let v = r.flag("distinct value")?;
                if set.last().is_some_and(|last| v <= *last) {
                    return Err(out_of_order);
                }
                set.insert(v);
            }
        }
        Distinct::Str { set, bytes } => {
            r.ensure(n, 4, "distinct values")?;
            for _ in 0..n {
                let v = r.string()?;
                if set
                    .last()
                    .is_some_and(|last| v.as_bytes() <= last.as_bytes())
                {
                    return Err(out_of_order);
                }
                *bytes += v.len();
                if *bytes > MAX_DISTINCT_BYTES {
                    return Err(Error::Corrupt("more distinct text than a state keeps"));
                }
                set.insert(v);
            }
        }
    }
    Ok(d)
}

fn bitwise_zero(fs: &[f64]) -> bool {
    fs.iter().all(|f| f.to_bits() == 0)
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f64(out: &mut Vec<u8>, v: f64) {
    put_u64(out, v.to_bits());
}

/// A length the state's limits keep far below `u32::MAX` (centroids, HLL
/// registers, distinct values, string bytes).
fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u32(out, u32::try_from(len).unwrap_or(u32::MAX));
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::F64(f) => put_f64(out, *f),
        Value::I64(i) => out.extend_from_slice(&i.to_le_bytes()),
        Value::U64(u) => put_u64(out, *u),
        Value::Bool(b) => out.push(u8::from(*b)),
        Value::Str(s) => put_str(out, s),
    }
}

fn get_value(r: &mut Reader<'_>, ty: ValueType) -> Result<Value> {
    Ok(match ty {
        ValueType::F64 => {
            let f = r.f64("value")?;
            if f.is_nan() && f.to_bits() != CANONICAL_NAN_BITS {
                return Err(Error::Corrupt("non-canonical NaN"));
            }
            Value::F64(f)
        }
        ValueType::I64 => Value::I64(i64::from_le_bytes(r.array("value")?)),
        ValueType::U64 => Value::U64(r.u64("value")?),
        ValueType::Bool => Value::Bool(r.flag("value")?),
        ValueType::Str => Value::Str(r.string()?),
    })
}

/// A cursor over untrusted bytes: every read checks what remains first.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(Error::Truncated {
                what,
                needed: n,
                remaining: self.bytes.len(),
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// Fails early, before any allocation, when `n` items of at least
    /// `item_bytes` each cannot fit in what remains.
    fn ensure(&self, n: usize, item_bytes: usize, what: &'static str) -> Result<()> {
        let needed = n.saturating_mul(item_bytes);
        if needed > self.bytes.len() {
            return Err(Error::Truncated {
                what,
                needed,
                remaining: self.bytes.len(),
            });
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let slice = self.take(N, what)?;
        <[u8; N]>::try_from(slice).map_err(|_| Error::Truncated {
            what,
            needed: N,
            remaining: slice.len(),
        })
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn flag(&mut self, what: &'static str) -> Result<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Error::Corrupt("a flag byte other than 0 or 1")),
        }
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn f64(&mut self, what: &'static str) -> Result<f64> {
        Ok(f64::from_bits(self.u64(what)?))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u32("text length")? as usize;
        if len > MAX_STRING_BYTES {
            return Err(Error::Corrupt("text value over the length limit"));
        }
        let bytes = self.take(len, "text")?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| Error::InvalidUtf8)
    }

    fn finish(self) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Error::TrailingBytes(self.bytes.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What a decode gave, comparable: the state's bytes or the error.
    fn outcome(r: Result<State>) -> std::result::Result<Vec<u8>, Error> {
        r.map(|s| s.encode())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The short path for a float min or max decodes exactly what the
        /// general decoder does, refusals included, for any bytes shaped
        /// like one (and some that are one byte off).
        #[test]
        fn the_float_extreme_shortcut_decodes_as_the_general_path(
            kind in prop::sample::select(vec![2u8, 3, 4, 5]),
            input in prop::sample::select(vec![1u8, 2]),
            presence in prop::sample::select(vec![0u8, 1, 2]),
            bits in prop_oneof![
                any::<u64>(),
                Just(CANONICAL_NAN_BITS),
                Just(f64::NAN.to_bits() | 1),
                Just((-0.0f64).to_bits()),
                Just(f64::INFINITY.to_bits()),
            ],
            extra in prop::collection::vec(any::<u8>(), 0..2),
            cut in 0usize..2,
        ) {
            let mut bytes = vec![FORMAT_VERSION, kind, input, presence];
            bytes.extend_from_slice(&bits.to_le_bytes());
            bytes.extend_from_slice(&extra);
            bytes.truncate(bytes.len() - cut);
            prop_assert_eq!(
                outcome(State::decode(&bytes)),
                outcome(State::decode_general(&bytes))
            );
        }
    }
}
