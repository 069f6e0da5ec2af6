//! Integer encodings: plain, constant, run-length, frame-of-reference, delta
//! and delta-of-delta, each ending in bit-packing, and frame-of-reference
//! and delta packed in base `range + 1` (radix packing) for small ranges
//! that are not a power of two; chosen per page by size.
//!
//! Why this module exists: timestamps, BIGINT and BIGINT UNSIGNED columns,
//! integer-valued floats, dictionary indexes and string lengths are all
//! integers, and the right encoding depends on the data (a regular 10 s
//! timestamp series is constant under delta-of-delta; a random walk has small
//! deltas; a tag's dictionary indexes come in long runs). Sizes are computed
//! exactly from one pass of statistics, so only the winning encoding is run.
//!
//! Values arrive as order-preserving `u64` keys: `i64` callers map through
//! [`super::bits::signed_key`], so one implementation serves both signed and
//! unsigned columns. All arithmetic on keys is wrapping, so any input, even
//! `i64::MIN` followed by `i64::MAX`, round-trips exactly.
//!
//! Decoders never trust a count they read: every count is bounded by the
//! number of values the page header declares, which is itself bounded by
//! `MAX_PAGE_VALUES`.

use super::Encoding;
use super::bits::{
    self, ByteReader, from_signed_key, put_varint, signed_key, varint_len, width_of,
};
use super::error::{ColumnarError, Result, corrupt};

/// Integer encodings, in tie-break order: on equal size the earlier (and
/// cheaper to decode) one wins.
pub(crate) const INT_ENCODINGS: [Encoding; 8] = [
    Encoding::Constant,
    Encoding::FrameOfReference,
    Encoding::Plain,
    Encoding::Delta,
    Encoding::DeltaOfDelta,
    Encoding::RunLength,
    Encoding::RadixFrame,
    Encoding::RadixDelta,
];

/// One pass over the values: everything the size of each encoding depends on.
#[derive(Debug, Clone)]
pub(crate) struct IntAnalysis {
    n: usize,
    min: u64,
    max: u64,
    runs: usize,
    run_len_min: u64,
    run_len_max: u64,
    /// Min and max of the deltas, as signed keys.
    delta_min: u64,
    delta_max: u64,
    /// Min and max of the deltas of deltas, as signed keys.
    dod_min: u64,
    dod_max: u64,
}

impl IntAnalysis {
    pub(crate) fn new(values: &[u64]) -> Self {
        let mut a = IntAnalysis {
            n: values.len(),
            min: u64::MAX,
            max: 0,
            runs: 0,
            run_len_min: u64::MAX,
            run_len_max: 0,
            delta_min: u64::MAX,
            delta_max: 0,
            dod_min: u64::MAX,
            dod_max: 0,
        };
        let mut run_len = 0u64;
        let mut prev: Option<u64> = None;
        let mut prev_delta: Option<u64> = None;
        for &v in values {
            a.min = a.min.min(v);
            a.max = a.max.max(v);
            if let Some(p) = prev {
                let d = v.wrapping_sub(p);
                let dk = signed_key(d as i64);
                a.delta_min = a.delta_min.min(dk);
                a.delta_max = a.delta_max.max(dk);
                if let Some(pd) = prev_delta {
                    let ddk = signed_key(d.wrapping_sub(pd) as i64);
                    a.dod_min = a.dod_min.min(ddk);
                    a.dod_max = a.dod_max.max(ddk);
                }
                prev_delta = Some(d);
                if v == p {
                    run_len += 1;
                } else {
                    a.close_run(run_len);
                    run_len = 1;
                }
            } else {
                run_len = 1;
            }
            prev = Some(v);
        }
        if run_len > 0 {
            a.close_run(run_len);
        }
        a
    }

    fn close_run(&mut self, len: u64) {
        self.runs += 1;
        self.run_len_min = self.run_len_min.min(len);
        self.run_len_max = self.run_len_max.max(len);
    }

    /// Exact encoded size of the body (without the encoding id byte), or
    /// `None` when the encoding cannot represent these values.
    pub(crate) fn size(&self, enc: Encoding) -> Option<usize> {
        let n = self.n;
        let range = |lo: u64, hi: u64| width_of(hi.wrapping_sub(lo));
        match enc {
            Encoding::Plain => Some(8 * n),
            Encoding::Constant => (n > 0 && self.min == self.max).then_some(8),
            Encoding::FrameOfReference => for_size(n, range(self.min, self.max)),
            Encoding::Delta => match n {
                0 => Some(0),
                _ => Some(8 + for_size(n - 1, range(self.delta_min, self.delta_max))?),
            },
            Encoding::DeltaOfDelta => match n {
                0 => Some(0),
                1 => Some(8),
                _ => Some(16 + for_size(n - 2, range(self.dod_min, self.dod_max))?),
            },
            Encoding::RunLength => {
                let values = for_size(self.runs, range(self.min, self.max))?;
                let lens = for_size(self.runs, range(self.run_len_min, self.run_len_max))?;
                Some(varint_len(self.runs as u64) + values + lens)
            }
            Encoding::RadixFrame => radix_size(n, self.max.wrapping_sub(self.min)),
            Encoding::RadixDelta => match n {
                0 => Some(0),
                _ => Some(8 + radix_size(n - 1, self.delta_max.wrapping_sub(self.delta_min))?),
            },
            _ => None,
        }
    }

    /// The smallest applicable encoding and its body size.
    pub(crate) fn best(&self) -> (Encoding, usize) {
        let mut best = (Encoding::Plain, 8 * self.n);
        for enc in INT_ENCODINGS {
            if let Some(size) = self.size(enc)
                && size < best.1
            {
                best = (enc, size);
            }
        }
        best
    }
}

/// Size of a frame-of-reference block of `k` values at `width`: nothing for an
/// empty block, else the minimum (8 bytes), the width (1) and the packed bits.
fn for_size(k: usize, width: u8) -> Option<usize> {
    if k == 0 {
        Some(0)
    } else {
        Some(9 + bits::packed_len(k, width)?)
    }
}

fn for_encode(values: &[u64], out: &mut Vec<u8>) {
    let Some(&first) = values.first() else { return };
    let (min, max) = values
        .iter()
        .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let width = width_of(max - min);
    out.extend_from_slice(&min.to_le_bytes());
    out.push(width);
    bits::pack(values.iter().map(|&v| v - min), width, out);
}

fn for_decode(r: &mut ByteReader<'_>, k: usize, out: &mut Vec<u64>) -> Result<()> {
    if k == 0 {
        return Ok(());
    }
    let min = r.u64()?;
    let width = r.u8()?;
    bits::unpack(r, k, width, min, out)
}

/// The radix of a radix block over values whose range (max - min) is
/// `range`, and how many of its digits one 32-bit word holds; `None` when
/// radix packing does not apply (a range of 0 or 1 packs as bits, a range
/// of 2^16 or more at one value a word, worse than bit-packing).
fn radix_of(range: u64) -> Option<(u32, usize)> {
    if !(2..1 << 16).contains(&range) {
        return None;
    }
    let radix = range as u32 + 1;
    let (mut per_word, mut cap) = (0usize, 1u64);
    while cap * u64::from(radix) <= 1 << 32 {
        cap *= u64::from(radix);
        per_word += 1;
    }
    Some((radix, per_word))
}

/// Size of a radix block of `k` values whose range is `range`: nothing for
/// an empty block, else the minimum (8 bytes), the radix less one (2) and
/// the words.
fn radix_size(k: usize, range: u64) -> Option<usize> {
    if k == 0 {
        return Some(0);
    }
    let (_, per_word) = radix_of(range)?;
    Some(10 + 4 * k.div_ceil(per_word))
}

/// Writes `values` as a radix block: the minimum, then each value's offset
/// from it as a digit of base `max - min + 1`, the first value of a word in
/// its lowest digit. Fails when radix packing does not apply.
fn radix_encode(values: &[u64], out: &mut Vec<u8>) -> Result<()> {
    let Some(&first) = values.first() else {
        return Ok(());
    };
    let (min, max) = values
        .iter()
        .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let (radix, per_word) = radix_of(max - min).ok_or_else(|| {
        ColumnarError::Invalid("radix packing needs a range of 2 to 65535".into())
    })?;
    out.extend_from_slice(&min.to_le_bytes());
    out.extend_from_slice(&((radix - 1) as u16).to_le_bytes());
    out.reserve(4 * values.len().div_ceil(per_word));
    for word in values.chunks(per_word) {
        // Below radix^per_word <= 2^32: no overflow.
        let w = word
            .iter()
            .rev()
            .fold(0u64, |w, &v| w * u64::from(radix) + (v - min));
        out.extend_from_slice(&(w as u32).to_le_bytes());
    }
    Ok(())
}

fn radix_decode(r: &mut ByteReader<'_>, k: usize, out: &mut Vec<u64>) -> Result<()> {
    if k == 0 {
        return Ok(());
    }
    let min = r.u64()?;
    let range = u64::from(r.u16()?);
    let (radix, per_word) = radix_of(range).ok_or_else(|| corrupt("radix out of range"))?;
    let nwords = k.div_ceil(per_word);
    let words = r.take(4 * nwords)?;
    let word_at = |i: usize| {
        let b = &words[4 * i..4 * i + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let divisor = strength_reduce::StrengthReducedU32::new(radix);
    let start = out.len();
    out.resize(start + k, 0);
    let dst = &mut out[start..];
    // Digits left in a word once its values are out: not a radix block.
    let mut extra = 0u32;
    // Each word's digits come one division after another; four words at a
    // time keep four such chains in flight instead of waiting on one.
    const LANES: usize = 4;
    let full = k / per_word;
    let mut wi = 0;
    while wi + LANES <= full {
        let mut w = [
            word_at(wi),
            word_at(wi + 1),
            word_at(wi + 2),
            word_at(wi + 3),
        ];
        let block = &mut dst[wi * per_word..(wi + LANES) * per_word];
        for j in 0..per_word {
            for (l, wl) in w.iter_mut().enumerate() {
                let (q, d) = strength_reduce::StrengthReducedU32::div_rem(*wl, divisor);
                block[l * per_word + j] = min.wrapping_add(u64::from(d));
                *wl = q;
            }
        }
        extra |= w[0] | w[1] | w[2] | w[3];
        wi += LANES;
    }
    // The rest a word at a time; the last may hold fewer digits.
    while wi < nwords {
        let mut w = word_at(wi);
        let first = wi * per_word;
        for slot in &mut dst[first..(first + per_word).min(k)] {
            let (q, d) = strength_reduce::StrengthReducedU32::div_rem(w, divisor);
            *slot = min.wrapping_add(u64::from(d));
            w = q;
        }
        extra |= w;
        wi += 1;
    }
    if extra != 0 {
        out.truncate(start);
        return Err(corrupt("radix word holds more digits than its values"));
    }
    Ok(())
}

/// Encodes `values` with `enc` (body only). Fails with `Invalid` when `enc`
/// is not an integer encoding or cannot represent the values.
pub(crate) fn encode(enc: Encoding, values: &[u64], out: &mut Vec<u8>) -> Result<()> {
    match enc {
        Encoding::Plain => {
            out.reserve(8 * values.len());
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Encoding::Constant => match values.first() {
            Some(&v) if values.iter().all(|&x| x == v) => out.extend_from_slice(&v.to_le_bytes()),
            _ => {
                return Err(ColumnarError::Invalid(
                    "constant encoding needs equal values".into(),
                ));
            }
        },
        Encoding::FrameOfReference => for_encode(values, out),
        Encoding::Delta => {
            if let Some(&first) = values.first() {
                out.extend_from_slice(&first.to_le_bytes());
                for_encode(&deltas_of(values), out);
            }
        }
        Encoding::DeltaOfDelta => {
            if let Some(&first) = values.first() {
                out.extend_from_slice(&first.to_le_bytes());
                if let Some(&second) = values.get(1) {
                    let first_delta = second.wrapping_sub(first);
                    out.extend_from_slice(&first_delta.to_le_bytes());
                    let dods: Vec<u64> = values
                        .windows(3)
                        .map(|w| {
                            let d1 = w[1].wrapping_sub(w[0]);
                            let d2 = w[2].wrapping_sub(w[1]);
                            signed_key(d2.wrapping_sub(d1) as i64)
                        })
                        .collect();
                    for_encode(&dods, out);
                }
            }
        }
        Encoding::RunLength => {
            let mut run_values = Vec::new();
            let mut run_lens = Vec::new();
            for &v in values {
                match (run_values.last(), run_lens.last_mut()) {
                    (Some(&last), Some(len)) if last == v => *len += 1,
                    _ => {
                        run_values.push(v);
                        run_lens.push(1u64);
                    }
                }
            }
            put_varint(out, run_values.len() as u64);
            for_encode(&run_values, out);
            for_encode(&run_lens, out);
        }
        Encoding::RadixFrame => radix_encode(values, out)?,
        Encoding::RadixDelta => {
            if let Some(&first) = values.first() {
                out.extend_from_slice(&first.to_le_bytes());
                radix_encode(&deltas_of(values), out)?;
            }
        }
        other => {
            return Err(ColumnarError::Invalid(format!(
                "{other:?} is not an integer encoding"
            )));
        }
    }
    Ok(())
}

/// Consecutive differences as signed keys (wrapping).
fn deltas_of(values: &[u64]) -> Vec<u64> {
    values
        .windows(2)
        .map(|w| signed_key(w[1].wrapping_sub(w[0]) as i64))
        .collect()
}

/// `first` then each delta (a signed key) added in turn.
/// Turns `out[from..]`, the zigzag keys of deltas, into the running sums
/// that follow `out[from - 1]`, in place.
fn undelta_in_place(out: &mut [u64], from: usize) {
    let Some((head, tail)) = from.checked_sub(1).map(|i| out[i..].split_at_mut(1)) else {
        return;
    };
    let mut acc = head[0];
    for v in tail {
        acc = acc.wrapping_add(from_signed_key(*v) as u64);
        *v = acc;
    }
}

/// Decodes exactly `n` values encoded with `enc` from `r`.
pub(crate) fn decode(enc: Encoding, r: &mut ByteReader<'_>, n: usize) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(n);
    match enc {
        Encoding::Plain => {
            for _ in 0..n {
                out.push(r.u64()?);
            }
        }
        Encoding::Constant => {
            let v = r.u64()?;
            out.resize(n, v);
        }
        Encoding::FrameOfReference => for_decode(r, n, &mut out)?,
        Encoding::Delta => {
            if n > 0 {
                // The deltas' keys decoded in place, then summed up.
                out.push(r.u64()?);
                for_decode(r, n - 1, &mut out)?;
                undelta_in_place(&mut out, 1);
            }
        }
        Encoding::RadixFrame => radix_decode(r, n, &mut out)?,
        Encoding::RadixDelta => {
            if n > 0 {
                // The deltas' keys decoded in place, then summed up.
                out.push(r.u64()?);
                radix_decode(r, n - 1, &mut out)?;
                undelta_in_place(&mut out, 1);
            }
        }
        Encoding::DeltaOfDelta => {
            if n > 0 {
                let mut acc = r.u64()?;
                out.push(acc);
                if n > 1 {
                    let mut delta = r.u64()?;
                    acc = acc.wrapping_add(delta);
                    out.push(acc);
                    let mut dods = Vec::with_capacity(n - 2);
                    for_decode(r, n - 2, &mut dods)?;
                    for ddk in dods {
                        delta = delta.wrapping_add(from_signed_key(ddk) as u64);
                        acc = acc.wrapping_add(delta);
                        out.push(acc);
                    }
                }
            }
        }
        Encoding::RunLength => {
            let runs = r.varint_at_most(n, "run count")?;
            let mut run_values = Vec::with_capacity(runs);
            for_decode(r, runs, &mut run_values)?;
            let mut run_lens = Vec::with_capacity(runs);
            for_decode(r, runs, &mut run_lens)?;
            for (v, len) in run_values.into_iter().zip(run_lens) {
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l >= 1 && l <= n - out.len());
                let len = len.ok_or_else(|| corrupt("run length out of range"))?;
                out.extend(std::iter::repeat_n(v, len));
            }
        }
        other => return Err(corrupt(format!("{other:?} is not an integer encoding"))),
    }
    if out.len() != n {
        return Err(corrupt(format!(
            "decoded {} integers, expected {n}",
            out.len()
        )));
    }
    Ok(out)
}

/// A self-describing block (encoding id, then body) holding the smallest
/// encoding of `values`; used inside other encodings (dictionary indexes,
/// string lengths, run lengths of bitmaps, integer-valued floats).
pub(crate) fn encode_block(values: &[u64], out: &mut Vec<u8>) -> Result<()> {
    let (enc, _) = IntAnalysis::new(values).best();
    out.push(enc.id());
    encode(enc, values, out)
}

pub(crate) fn decode_block(r: &mut ByteReader<'_>, n: usize) -> Result<Vec<u64>> {
    let enc = Encoding::from_id(r.u8()?)?;
    decode(enc, r, n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(enc: Encoding, values: &[u64]) {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf).unwrap();
        let analysis = IntAnalysis::new(values);
        assert_eq!(
            analysis.size(enc),
            Some(buf.len()),
            "{enc:?} size estimate for {values:?}"
        );
        let mut r = ByteReader::new(&buf);
        assert_eq!(
            decode(enc, &mut r, values.len()).unwrap(),
            values,
            "{enc:?}"
        );
        r.finish("ints").unwrap();
    }

    fn edge_cases() -> Vec<Vec<u64>> {
        let keys = |v: &[i64]| v.iter().map(|&x| signed_key(x)).collect::<Vec<_>>();
        vec![
            vec![],
            vec![42],
            vec![7; 1024],
            keys(&[i64::MIN, i64::MAX]),
            keys(&[i64::MAX, i64::MIN, i64::MAX, i64::MIN]),
            keys(&[i64::MIN, i64::MAX, 0, -1, 1]),
            vec![0, u64::MAX, 0, u64::MAX],
            vec![u64::MAX; 3],
            (0..1024u64)
                .map(|i| 1_700_000_000_000_000_000 + i * 10_000_000_000)
                .collect(),
            (0..1024u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect(),
            (0..1024u64).map(|i| i / 100).collect(),
        ]
    }

    #[test]
    fn every_integer_encoding_round_trips_edge_cases() {
        for values in edge_cases() {
            for enc in INT_ENCODINGS {
                if IntAnalysis::new(&values).size(enc).is_some() {
                    round_trip(enc, &values);
                }
            }
        }
    }

    #[test]
    fn constant_is_refused_for_unequal_or_empty_values() {
        assert!(encode(Encoding::Constant, &[1, 2], &mut Vec::new()).is_err());
        assert!(encode(Encoding::Constant, &[], &mut Vec::new()).is_err());
        assert_eq!(IntAnalysis::new(&[]).size(Encoding::Constant), None);
    }

    #[test]
    fn regular_timestamps_pack_at_zero_width() {
        // Frame-of-reference over the deltas already makes a constant step
        // zero bits wide, so plain delta (17 bytes) beats delta-of-delta (25).
        let ts: Vec<u64> = (0..1024i64)
            .map(|i| signed_key(1_700_000_000_000_000_000 + i * 10_000_000_000))
            .collect();
        let analysis = IntAnalysis::new(&ts);
        assert_eq!(analysis.best(), (Encoding::Delta, 8 + 9));
        assert_eq!(analysis.size(Encoding::DeltaOfDelta), Some(8 + 8 + 9));
    }

    #[test]
    fn drifting_steps_choose_delta_of_delta() {
        // Deltas grow by 3 each step: deltas span 3,000, deltas of deltas 0.
        let v: Vec<u64> = (0..1000i64)
            .map(|i| signed_key(5 + 3 * i * (i + 1) / 2))
            .collect();
        let (enc, size) = IntAnalysis::new(&v).best();
        assert_eq!((enc, size), (Encoding::DeltaOfDelta, 8 + 8 + 9));
        round_trip(Encoding::DeltaOfDelta, &v);
    }

    #[test]
    fn small_range_chooses_frame_of_reference() {
        // A pseudo-random sequence in 0..100: deltas are as wide as the range,
        // so frame-of-reference (7 bits) wins.
        let mut x = 12345u64;
        let v: Vec<u64> = (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % 100
            })
            .collect();
        let (enc, size) = IntAnalysis::new(&v).best();
        assert_eq!(enc, Encoding::FrameOfReference);
        assert_eq!(size, 9 + 1024 * 7 / 8);
    }

    /// A TSBS-style random walk: integers 0..=100 moving by -5..=5.
    fn walk(n: usize, seed: u64) -> Vec<u64> {
        let mut x = seed;
        let mut v = 50i64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v = (v + (x % 11) as i64 - 5).clamp(0, 100);
                signed_key(v)
            })
            .collect()
    }

    #[test]
    fn a_random_walk_chooses_radix_delta_at_under_four_bits() {
        let v = walk(1024, 99);
        let (enc, size) = IntAnalysis::new(&v).best();
        assert_eq!(enc, Encoding::RadixDelta);
        // First value, minimum, radix, then 1,023 deltas 9 to a word.
        assert_eq!(size, 8 + 8 + 2 + 4 * 1023usize.div_ceil(9));
        assert!(size < IntAnalysis::new(&v).size(Encoding::Delta).unwrap() * 9 / 10);
        round_trip(Encoding::RadixDelta, &v);
    }

    #[test]
    fn radix_blocks_round_trip_at_every_boundary() {
        for range in [2u64, 3, 4, 5, 10, 254, 255, 256, 65_534, 65_535] {
            let (radix, per_word) = radix_of(range).unwrap();
            assert_eq!(u64::from(radix), range + 1);
            assert!(u64::from(radix).pow(per_word as u32) <= 1 << 32);
            assert!(u128::from(radix).pow(per_word as u32 + 1) > 1 << 32);
            // Counts around the four-word blocks the decoder takes at once.
            for n in [
                1,
                per_word - 1,
                per_word,
                per_word + 1,
                3 * per_word,
                4 * per_word - 1,
                4 * per_word,
                4 * per_word + 1,
                8 * per_word + 3,
                1024,
            ] {
                let base = u64::MAX - range;
                let values: Vec<u64> = (0..n as u64)
                    .map(|i| base + (i * 7919 % (range + 1)))
                    .chain([base, u64::MAX])
                    .collect();
                round_trip(Encoding::RadixFrame, &values);
                let mut deltas = vec![0u64];
                for (i, d) in values.iter().enumerate() {
                    let step = from_signed_key(signed_key(*d as i64 % 3 - 1));
                    deltas.push(deltas[i].wrapping_add(step as u64));
                }
                if IntAnalysis::new(&deltas)
                    .size(Encoding::RadixDelta)
                    .is_some()
                {
                    round_trip(Encoding::RadixDelta, &deltas);
                }
            }
        }
        assert_eq!(radix_of(0), None);
        assert_eq!(radix_of(1), None);
        assert_eq!(radix_of(1 << 16), None);
        assert!(encode(Encoding::RadixFrame, &[0, 1 << 16], &mut Vec::new()).is_err());
        assert!(encode(Encoding::RadixFrame, &[5, 6], &mut Vec::new()).is_err());
    }

    #[test]
    fn radix_decoder_rejects_bad_radixes_and_extra_digits() {
        let mut buf = Vec::new();
        encode(Encoding::RadixFrame, &[0, 1, 2], &mut buf).unwrap();
        assert!(decode(Encoding::RadixFrame, &mut ByteReader::new(&buf), 3).is_ok());
        // Radix 2 (stored as 1) is not a radix block.
        let mut bad = buf.clone();
        bad[8..10].copy_from_slice(&1u16.to_le_bytes());
        assert!(decode(Encoding::RadixFrame, &mut ByteReader::new(&bad), 3).is_err());
        // A word holding a digit beyond the values it declares.
        let mut bad = buf.clone();
        bad[10..14].copy_from_slice(&(2u32 + 3 * 1 + 9 * 2 + 27).to_le_bytes());
        assert!(decode(Encoding::RadixFrame, &mut ByteReader::new(&bad), 3).is_err());
        // Truncated words.
        assert!(decode(Encoding::RadixFrame, &mut ByteReader::new(&buf[..12]), 3).is_err());
    }

    #[test]
    fn rle_decoder_rejects_bad_run_lengths() {
        // Two runs of lengths 1 and 1 claimed for n = 3.
        let mut buf = Vec::new();
        encode(Encoding::RunLength, &[5, 6], &mut buf).unwrap();
        assert!(decode(Encoding::RunLength, &mut ByteReader::new(&buf), 3).is_err());
        assert!(decode(Encoding::RunLength, &mut ByteReader::new(&buf), 1).is_err());
        // A zero-length run.
        let mut buf = Vec::new();
        put_varint(&mut buf, 1);
        for_encode(&[9], &mut buf);
        for_encode(&[0], &mut buf);
        assert!(decode(Encoding::RunLength, &mut ByteReader::new(&buf), 0).is_err());
        assert!(decode(Encoding::RunLength, &mut ByteReader::new(&buf), 1).is_err());
    }

    fn int_values() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            proptest::collection::vec(any::<u64>(), 0..300),
            proptest::collection::vec(0u64..4, 0..300),
            proptest::collection::vec(0u64..11, 0..300),
            (any::<u64>(), 0usize..300).prop_map(|(seed, n)| walk(n, seed | 1)),
            proptest::collection::vec(any::<i8>().prop_map(|v| signed_key(i64::from(v))), 0..300),
            (
                any::<i64>(),
                any::<i32>(),
                proptest::collection::vec(-3i64..3, 0..300)
            )
                .prop_map(|(start, step, jitter)| {
                    jitter
                        .iter()
                        .enumerate()
                        .map(|(i, j)| {
                            signed_key(
                                start.wrapping_add((i as i64).wrapping_mul(i64::from(step)) + j),
                            )
                        })
                        .collect()
                }),
        ]
    }

    proptest! {
        #[test]
        fn every_applicable_encoding_round_trips_with_exact_size(values in int_values()) {
            let analysis = IntAnalysis::new(&values);
            for enc in INT_ENCODINGS {
                if analysis.size(enc).is_some() {
                    round_trip(enc, &values);
                }
            }
            let mut block = Vec::new();
            encode_block(&values, &mut block).unwrap();
            prop_assert_eq!(block.len(), 1 + analysis.best().1);
            let mut r = ByteReader::new(&block);
            prop_assert_eq!(decode_block(&mut r, values.len()).unwrap(), values);
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..1100,
        ) {
            let mut r = ByteReader::new(&bytes);
            let _ = decode_block(&mut r, n);
        }
    }
}
