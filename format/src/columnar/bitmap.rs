//! Boolean columns and null masks: a plain bitmap, or runs when they are
//! shorter.
//!
//! Why this module exists: BOOLEAN fields and the null mask of every column
//! are the same problem. A bitmap costs n/8 bytes whatever the data; a mask
//! with one null in a page, or a flag that rarely flips, is a handful of runs,
//! so both are tried and the smaller kept.

use super::bits::{ByteReader, put_varint};
use super::error::{ColumnarError, Result, corrupt};
use super::{Encoding, int};

pub(crate) const BOOL_ENCODINGS: [Encoding; 2] = [Encoding::Plain, Encoding::RunLength];

pub(crate) fn encode(enc: Encoding, values: &[bool], out: &mut Vec<u8>) -> Result<()> {
    match enc {
        Encoding::Plain => {
            for chunk in values.chunks(8) {
                out.push(
                    chunk
                        .iter()
                        .enumerate()
                        .fold(0u8, |b, (i, &v)| b | (u8::from(v) << i)),
                );
            }
        }
        Encoding::RunLength => {
            let Some(&first) = values.first() else {
                return Ok(());
            };
            let mut lens: Vec<u64> = vec![0];
            let mut cur = first;
            for &v in values {
                if v != cur {
                    lens.push(0);
                    cur = v;
                }
                if let Some(last) = lens.last_mut() {
                    *last += 1;
                }
            }
            out.push(u8::from(first));
            put_varint(out, lens.len() as u64);
            int::encode_block(&lens, out)?;
        }
        other => {
            return Err(ColumnarError::Invalid(format!(
                "{other:?} is not a boolean encoding"
            )));
        }
    }
    Ok(())
}

pub(crate) fn decode(enc: Encoding, r: &mut ByteReader<'_>, n: usize) -> Result<Vec<bool>> {
    let mut out = Vec::with_capacity(n);
    match enc {
        Encoding::Plain => {
            let bytes = r.take(n.div_ceil(8))?;
            out.extend((0..n).map(|i| bytes.get(i / 8).is_some_and(|b| (b >> (i % 8)) & 1 == 1)));
            if !n.is_multiple_of(8) && bytes.last().is_some_and(|b| b >> (n % 8) != 0) {
                return Err(corrupt("nonzero padding bits in bitmap"));
            }
        }
        Encoding::RunLength => {
            if n > 0 {
                let mut cur = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(corrupt("run start is not a boolean")),
                };
                let runs = r.varint_at_most(n, "boolean run count")?;
                for len in int::decode_block(r, runs)? {
                    let len = usize::try_from(len)
                        .ok()
                        .filter(|&l| l >= 1 && l <= n - out.len());
                    let len = len.ok_or_else(|| corrupt("boolean run length out of range"))?;
                    out.extend(std::iter::repeat_n(cur, len));
                    cur = !cur;
                }
            }
        }
        other => return Err(corrupt(format!("{other:?} is not a boolean encoding"))),
    }
    if out.len() != n {
        return Err(corrupt(format!(
            "decoded {} booleans, expected {n}",
            out.len()
        )));
    }
    Ok(out)
}

/// The smaller of bitmap and runs, with its body.
pub(crate) fn encode_best(values: &[bool]) -> Result<(Encoding, Vec<u8>)> {
    let mut best: Option<(Encoding, Vec<u8>)> = None;
    for enc in BOOL_ENCODINGS {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf)?;
        if best.as_ref().is_none_or(|(_, b)| buf.len() < b.len()) {
            best = Some((enc, buf));
        }
    }
    best.ok_or_else(|| ColumnarError::Invalid("no boolean encoding applies".into()))
}

/// A self-describing block (encoding id, then body); used for null masks.
pub(crate) fn encode_block(values: &[bool], out: &mut Vec<u8>) -> Result<()> {
    let (enc, body) = encode_best(values)?;
    out.push(enc.id());
    out.extend_from_slice(&body);
    Ok(())
}

pub(crate) fn decode_block(r: &mut ByteReader<'_>, n: usize) -> Result<Vec<bool>> {
    let enc = Encoding::from_id(r.u8()?)?;
    decode(enc, r, n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(enc: Encoding, values: &[bool]) {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf).unwrap();
        let mut r = ByteReader::new(&buf);
        assert_eq!(
            decode(enc, &mut r, values.len()).unwrap(),
            values,
            "{enc:?}"
        );
        r.finish("booleans").unwrap();
    }

    #[test]
    fn bitmap_and_runs_round_trip_edge_cases() {
        let cases: Vec<Vec<bool>> = vec![
            vec![],
            vec![true],
            vec![false],
            vec![true; 1024],
            vec![false; 1024],
            (0..1024).map(|i| i % 2 == 0).collect(),
            (0..13).map(|i| i % 3 == 0).collect(),
        ];
        for values in cases {
            for enc in BOOL_ENCODINGS {
                round_trip(enc, &values);
            }
        }
    }

    #[test]
    fn a_single_null_in_a_page_costs_a_few_bytes() {
        let mut mask = vec![false; 1024];
        mask[500] = true;
        let (enc, body) = encode_best(&mask).unwrap();
        assert_eq!(enc, Encoding::RunLength);
        assert!(body.len() < 20, "{} bytes", body.len());
    }

    #[test]
    fn alternating_values_are_runs_of_constant_length() {
        // 1,024 runs of length 1: the run lengths encode as one constant.
        let alternating: Vec<bool> = (0..1024).map(|i| i % 2 == 1).collect();
        let (enc, body) = encode_best(&alternating).unwrap();
        assert_eq!(enc, Encoding::RunLength);
        assert!(body.len() < 16, "{} bytes", body.len());
    }

    #[test]
    fn random_values_keep_the_bitmap() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let random: Vec<bool> = (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x & 1 == 1
            })
            .collect();
        let (enc, body) = encode_best(&random).unwrap();
        assert_eq!(enc, Encoding::Plain);
        assert_eq!(body.len(), 128);
    }

    proptest! {
        #[test]
        fn random_booleans_round_trip(values in proptest::collection::vec(any::<bool>(), 0..1100)) {
            for enc in BOOL_ENCODINGS {
                round_trip(enc, &values);
            }
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..1100,
        ) {
            let _ = decode_block(&mut ByteReader::new(&bytes), n);
        }
    }
}
