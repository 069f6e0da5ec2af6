//! Float encodings: frame-of-reference over integers for integer-valued
//! floats, Gorilla XOR for the rest, plain bits when neither is smaller.
//!
//! Why this module exists: most metric values stored as DOUBLE are small
//! integers (TSBS cpu values are 0..=100), which bit-pack to a few bits each
//! once seen as integers, while true floats need Gorilla's XOR scheme. Every
//! encoding here must round-trip the exact bits: `-0.0` stays `-0.0`, each NaN
//! payload and both infinities come back bit for bit. So only floats that an
//! `i64` holds exactly, and that are not `-0.0`, take the integer path; all
//! other bit patterns go through Gorilla or plain, which work on raw bits.

use super::Encoding;
use super::bits::{
    BitWriter, ByteReader, check_stream_end, from_signed_key, mask, peek128, signed_key,
};
use super::error::{ColumnarError, Result, corrupt};
use super::int;

/// Integers of magnitude up to 2^53 are exactly representable as f64, and
/// their conversion in both directions is exact.
const MAX_EXACT_INT: f64 = 9_007_199_254_740_992.0; // 2^53

/// True when `v` is an integer in ±2^53 whose `i64` round trip gives back the
/// same bits. `-0.0` is excluded: `-0.0 as i64 as f64` is `+0.0`.
pub(crate) fn is_integer_valued(v: f64) -> bool {
    v.fract() == 0.0 && v.abs() <= MAX_EXACT_INT && !(v == 0.0 && v.is_sign_negative())
}

/// The float encodings, in tie-break order.
pub(crate) const FLOAT_ENCODINGS: [Encoding; 3] =
    [Encoding::IntegerFloat, Encoding::Plain, Encoding::Gorilla];

/// Chooses the smallest encoding and returns it with its encoded body.
///
/// Sizes are known without encoding for plain (8 bytes a value) and the
/// integer path (exact, from one pass of integer statistics); Gorilla's is
/// counted in a pass that stops as soon as it cannot win. Only the winner is
/// encoded.
pub(crate) fn encode_best(values: &[f64]) -> Result<(Encoding, Vec<u8>)> {
    let mut best = (Encoding::Plain, 8 * values.len());
    let mut keys = None;
    if values.iter().all(|&v| is_integer_valued(v)) {
        let k: Vec<u64> = values.iter().map(|&v| signed_key(v as i64)).collect();
        let size = 1 + int::IntAnalysis::new(&k).best().1;
        if size <= best.1 {
            best = (Encoding::IntegerFloat, size);
        }
        keys = Some(k);
    }
    if let Some(size) = gorilla_size(values, best.1) {
        best = (Encoding::Gorilla, size);
    }
    let mut out = Vec::with_capacity(best.1);
    match (best.0, keys) {
        (Encoding::IntegerFloat, Some(k)) => int::encode_block(&k, &mut out)?,
        (enc, _) => encode(enc, values, &mut out)?,
    }
    Ok((best.0, out))
}

/// The exact size of the Gorilla encoding (length prefix included) when it
/// is smaller than `limit` bytes; `None` as soon as it cannot be.
fn gorilla_size(values: &[f64], limit: usize) -> Option<usize> {
    let limit_bits = limit.saturating_mul(8);
    let mut iter = values.iter().map(|v| v.to_bits());
    let mut bits = 0usize;
    if let Some(first) = iter.next() {
        bits = 64;
        let mut prev = first;
        let mut window: Option<(u32, u32)> = None;
        for cur in iter {
            let xor = cur ^ prev;
            prev = cur;
            bits += 1;
            if xor != 0 {
                let lz = xor.leading_zeros();
                let tz = xor.trailing_zeros();
                match window {
                    Some((wl, wt)) if lz >= wl && tz >= wt => bits += 1 + (64 - wl - wt) as usize,
                    _ => {
                        bits += 13 + (64 - lz - tz) as usize;
                        window = Some((lz, tz));
                    }
                }
            }
            if bits >= limit_bits {
                return None;
            }
        }
    }
    let stream = bits.div_ceil(8);
    let size = super::bits::varint_len(stream as u64) + stream;
    (size < limit).then_some(size)
}

pub(crate) fn encode(enc: Encoding, values: &[f64], out: &mut Vec<u8>) -> Result<()> {
    match enc {
        Encoding::Plain => {
            out.reserve(values.len() * 8);
            for v in values {
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        Encoding::IntegerFloat => {
            if !values.iter().all(|&v| is_integer_valued(v)) {
                return Err(ColumnarError::Invalid(
                    "values are not all integer-valued floats".into(),
                ));
            }
            let keys: Vec<u64> = values.iter().map(|&v| signed_key(v as i64)).collect();
            int::encode_block(&keys, out)?;
        }
        Encoding::Gorilla => gorilla_encode(values, out),
        other => {
            return Err(ColumnarError::Invalid(format!(
                "{other:?} is not a float encoding"
            )));
        }
    }
    Ok(())
}

pub(crate) fn decode(enc: Encoding, r: &mut ByteReader<'_>, n: usize) -> Result<Vec<f64>> {
    match enc {
        Encoding::Plain => (0..n).map(|_| Ok(f64::from_bits(r.u64()?))).collect(),
        Encoding::IntegerFloat => {
            // A page passing its CRC can still be crafted; refuse values the
            // encoder could never have written rather than round them. Checked
            // once for the page, so the conversion runs without a branch
            // (and reuses the keys' allocation).
            let mut largest = 0u64;
            let values: Vec<f64> = int::decode_block(r, n)?
                .into_iter()
                .map(|k| {
                    let i = from_signed_key(k);
                    largest = largest.max(i.unsigned_abs());
                    i as f64
                })
                .collect();
            if largest > 1 << 53 {
                return Err(corrupt("integer-valued float out of ±2^53"));
            }
            Ok(values)
        }
        Encoding::Gorilla => gorilla_decode(r, n),
        other => Err(corrupt(format!("{other:?} is not a float encoding"))),
    }
}

/// Gorilla XOR (Pelkonen et al., VLDB 2015), with 6 bits for the leading-zero
/// count (the paper uses 5 and caps it) and 6 bits for the meaningful length
/// minus one. The stream is prefixed by its byte length so that a decoder
/// knows where it ends and can reject trailing garbage.
fn gorilla_encode(values: &[f64], out: &mut Vec<u8>) {
    let mut stream = Vec::with_capacity(values.len() * 2);
    {
        let mut w = BitWriter::new(&mut stream);
        let mut iter = values.iter().map(|v| v.to_bits());
        if let Some(first) = iter.next() {
            w.write(first, 64);
            let mut prev = first;
            // (leading zeros, trailing zeros) of the current window; none yet.
            let mut window: Option<(u32, u32)> = None;
            for cur in iter {
                let xor = cur ^ prev;
                prev = cur;
                if xor == 0 {
                    w.write_bit(false);
                    continue;
                }
                w.write_bit(true);
                let lz = xor.leading_zeros();
                let tz = xor.trailing_zeros();
                match window {
                    Some((wl, wt)) if lz >= wl && tz >= wt => {
                        w.write_bit(false);
                        w.write(xor >> wt, (64 - wl - wt) as u8);
                    }
                    _ => {
                        let len = 64 - lz - tz;
                        w.write_bit(true);
                        w.write(u64::from(lz), 6);
                        w.write(u64::from(len - 1), 6);
                        w.write(xor >> tz, len as u8);
                        window = Some((lz, tz));
                    }
                }
            }
        }
        w.finish();
    }
    super::bits::put_varint(out, stream.len() as u64);
    out.extend_from_slice(&stream);
}

fn gorilla_decode(r: &mut ByteReader<'_>, n: usize) -> Result<Vec<f64>> {
    // A value takes at most 2 + 12 + 64 bits, under 10 bytes.
    let max_len = 10 * n + 8;
    let len = r.varint_at_most(max_len, "gorilla stream length")?;
    let bytes = r.take(len)?;
    let total_bits = bytes.len() * 8;
    let mut out = Vec::with_capacity(n);
    let mut pos = 0usize;
    if n > 0 {
        // Each step peeks a 128-bit window (a step uses at most 78 bits),
        // parses the control bits and value from it, and advances once. Bits
        // past the end read as zero, so the bound is checked after each step.
        let mut prev = peek128(bytes, 0) as u64;
        pos = 64;
        if pos > total_bits {
            return Err(corrupt("gorilla stream truncated"));
        }
        out.push(f64::from_bits(prev));
        // (leading zeros, trailing zeros, meaningful bits) of the window.
        let mut window: Option<(u32, u32, u32)> = None;
        for _ in 1..n {
            let word = peek128(bytes, pos);
            if word & 1 == 0 {
                pos += 1;
            } else {
                let (tz, len, header) = if word & 2 == 0 {
                    let (_, wt, wlen) = window
                        .ok_or_else(|| corrupt("gorilla reuses a window before setting one"))?;
                    (wt, wlen, 2)
                } else {
                    let lz = ((word >> 2) & 63) as u32;
                    let len = ((word >> 8) & 63) as u32 + 1;
                    if lz + len > 64 {
                        return Err(corrupt("gorilla window exceeds 64 bits"));
                    }
                    let w = (lz, 64 - lz - len, len);
                    window = Some(w);
                    (w.1, len, 14)
                };
                // len is 1..=64 and tz = 64 - lz - len <= 63: shifts are in range.
                let bits = ((word >> header) as u64) & mask(len as u8);
                prev ^= bits << tz;
                pos += (header + len) as usize;
            }
            if pos > total_bits {
                return Err(corrupt("gorilla stream truncated"));
            }
            out.push(f64::from_bits(prev));
        }
    }
    check_stream_end(bytes, pos)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A crafted integer-float page holding an integer past ±2^53 (which
    /// the encoder never writes) is refused wherever in the page it sits,
    /// not rounded; ±2^53 itself reads back.
    #[test]
    fn integer_floats_past_two_to_the_53_are_refused() {
        // An integer-float page holding `ints`, decoded.
        let read = |ints: &[i64]| {
            let keys: Vec<u64> = ints.iter().map(|&i| signed_key(i)).collect();
            let mut buf = Vec::new();
            int::encode_block(&keys, &mut buf).unwrap();
            decode(
                Encoding::IntegerFloat,
                &mut ByteReader::new(&buf),
                keys.len(),
            )
        };
        let limit = 1i64 << 53;
        for (bad, at) in [(limit + 1, 0), (-limit - 1, 5), (i64::MAX, 9)] {
            let mut ints = vec![limit, -limit, 0, 7, -7, 1, 2, 3, 4, 5];
            ints[at] = bad;
            assert!(read(&ints).is_err(), "{bad} at {at}");
            ints[at] = limit;
            let want: Vec<f64> = ints.iter().map(|&i| i as f64).collect();
            assert_eq!(bits(&read(&ints).unwrap()), bits(&want));
        }
    }

    fn round_trip(enc: Encoding, values: &[f64]) {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf).unwrap();
        let mut r = ByteReader::new(&buf);
        let back = decode(enc, &mut r, values.len()).unwrap();
        r.finish("floats").unwrap();
        assert_eq!(bits(&back), bits(values), "{enc:?}");
    }

    fn nans() -> Vec<f64> {
        vec![
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001), // signalling NaN
            f64::from_bits(0x7ff8_dead_beef_0001),
            f64::from_bits(0xfff0_0000_0000_0001),
            f64::from_bits(u64::MAX),
        ]
    }

    #[test]
    fn integer_valued_excludes_negative_zero_nan_inf_and_huge() {
        assert!(is_integer_valued(0.0));
        assert!(is_integer_valued(-5.0));
        assert!(is_integer_valued(MAX_EXACT_INT));
        assert!(is_integer_valued(-MAX_EXACT_INT));
        assert!(!is_integer_valued(-0.0));
        assert!(!is_integer_valued(0.5));
        assert!(!is_integer_valued(f64::INFINITY));
        assert!(!is_integer_valued(f64::NEG_INFINITY));
        assert!(!is_integer_valued(MAX_EXACT_INT * 2.0));
        for n in nans() {
            assert!(!is_integer_valued(n));
        }
    }

    #[test]
    fn plain_and_gorilla_round_trip_special_values_bit_exactly() {
        let mut special = nans();
        special.extend([
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
        ]);
        special.extend([5e-324, -5e-324, 1.0, 1.0, 1.0, -0.0, -0.0]);
        let mut cases = vec![
            vec![],
            vec![1.5],
            vec![-0.0],
            special.clone(),
            vec![f64::NAN; 1024],
        ];
        cases.push(special.iter().rev().copied().collect());
        for values in cases {
            round_trip(Encoding::Plain, &values);
            round_trip(Encoding::Gorilla, &values);
        }
    }

    #[test]
    fn integer_float_round_trips_its_domain_and_refuses_others() {
        for values in [
            vec![],
            vec![0.0],
            vec![-MAX_EXACT_INT, MAX_EXACT_INT],
            (0..1024).map(|i| f64::from(i % 101)).collect(),
            vec![42.0; 1024],
        ] {
            round_trip(Encoding::IntegerFloat, &values);
        }
        for bad in [
            vec![1.0, -0.0],
            vec![f64::NAN],
            vec![f64::INFINITY],
            vec![0.25],
        ] {
            assert!(encode(Encoding::IntegerFloat, &bad, &mut Vec::new()).is_err());
        }
    }

    #[test]
    fn gorilla_decoder_rejects_a_window_wider_than_64_bits() {
        let mut stream = Vec::new();
        let mut w = BitWriter::new(&mut stream);
        w.write(0, 64);
        w.write_bit(true);
        w.write_bit(true);
        w.write(40, 6); // leading zeros
        w.write(40, 6); // length - 1: 40 + 41 > 64
        w.write(0, 41);
        w.finish();
        let mut buf = Vec::new();
        super::super::bits::put_varint(&mut buf, stream.len() as u64);
        buf.extend_from_slice(&stream);
        assert!(decode(Encoding::Gorilla, &mut ByteReader::new(&buf), 2).is_err());
    }

    #[test]
    fn integer_valued_floats_choose_the_integer_path() {
        let v: Vec<f64> = (0..1024).map(|i| f64::from((i * 7) % 100)).collect();
        let (enc, body) = encode_best(&v).unwrap();
        assert_eq!(enc, Encoding::IntegerFloat);
        assert!(body.len() < 1024, "{} bytes", body.len());
    }

    #[test]
    fn best_choice_encodes_exactly_what_it_measured() {
        let cases: Vec<Vec<f64>> = vec![
            vec![],
            vec![f64::NAN],
            vec![1.0; 1024],
            [
                4_503_599_627_370_496.0,
                4_503_599_627_370_496.0 + 1_099_511_627_776.0,
            ]
            .repeat(100),
            (0..1024).map(|i| f64::from(i) / 10.0).collect(),
        ];
        for values in cases {
            let mut gorilla = Vec::new();
            encode(Encoding::Gorilla, &values, &mut gorilla).unwrap();
            assert_eq!(gorilla_size(&values, usize::MAX), Some(gorilla.len()));
            assert_eq!(
                gorilla_size(&values, gorilla.len()),
                None,
                "a tie is not a win"
            );
            let (enc, body) = encode_best(&values).unwrap();
            let mut direct = Vec::new();
            encode(enc, &values, &mut direct).unwrap();
            assert_eq!(body, direct);
            for other in FLOAT_ENCODINGS {
                let mut buf = Vec::new();
                if encode(other, &values, &mut buf).is_ok() {
                    assert!(
                        body.len() <= buf.len(),
                        "{enc:?} chosen over smaller {other:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn gorilla_beats_the_integer_path_when_only_one_mantissa_bit_flips() {
        // 2^52 and 2^52 + 2^40 alternate: 41 bits as integers, a few bits as XOR.
        let values = [
            4_503_599_627_370_496.0,
            4_503_599_627_370_496.0 + 1_099_511_627_776.0,
        ]
        .repeat(100);
        assert_eq!(encode_best(&values).unwrap().0, Encoding::Gorilla);
    }

    proptest! {
        #[test]
        fn every_float_encoding_round_trips_random_bits(
            raw in proptest::collection::vec(any::<u64>(), 0..200),
            small in proptest::collection::vec(-1000i32..1000, 0..200),
        ) {
            let floats: Vec<f64> = raw.iter().map(|&b| f64::from_bits(b)).collect();
            round_trip(Encoding::Plain, &floats);
            round_trip(Encoding::Gorilla, &floats);
            let ints: Vec<f64> = small.iter().map(|&i| f64::from(i)).collect();
            round_trip(Encoding::IntegerFloat, &ints);
            round_trip(Encoding::Gorilla, &ints);
            for values in [&floats, &ints] {
                let (enc, body) = encode_best(values).unwrap();
                let back = decode(enc, &mut ByteReader::new(&body), values.len()).unwrap();
                prop_assert_eq!(bits(&back), bits(values));
                for other in FLOAT_ENCODINGS {
                    let mut buf = Vec::new();
                    if encode(other, values, &mut buf).is_ok() {
                        prop_assert!(body.len() <= buf.len(), "{:?} chosen over smaller {:?}", enc, other);
                    }
                }
            }
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..1100,
        ) {
            for enc in FLOAT_ENCODINGS {
                let _ = decode(enc, &mut ByteReader::new(&bytes), n);
            }
        }
    }
}
