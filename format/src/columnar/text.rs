//! Text encodings: a sorted dictionary with bit-packed (or run-length)
//! indexes, or plain length-prefixed strings, whichever is smaller.
//!
//! Why this module exists: tag columns repeat the same few values, and rows
//! are sorted by series key, so a page of tags is a few long runs: a
//! dictionary plus run-length indexes stores it in a few bytes. Free-form text
//! fields rarely repeat, and plain strings beat a dictionary there.
//!
//! The dictionary is sorted and its entries distinct (the decoder checks
//! both), so index order is value order: a later reader can evaluate
//! comparisons on the indexes without decoding strings. Every decoded string
//! is checked to be UTF-8.

use super::bits::{ByteReader, put_varint};
use super::error::{ColumnarError, Result, corrupt};
use super::{Encoding, int};

pub(crate) const TEXT_ENCODINGS: [Encoding; 2] = [Encoding::Plain, Encoding::Dictionary];

fn put_strings<'a>(values: impl Iterator<Item = &'a str> + Clone, out: &mut Vec<u8>) -> Result<()> {
    let lens: Vec<u64> = values.clone().map(|s| s.len() as u64).collect();
    int::encode_block(&lens, out)?;
    for s in values {
        out.extend_from_slice(s.as_bytes());
    }
    Ok(())
}

fn read_strings(r: &mut ByteReader<'_>, n: usize) -> Result<Vec<String>> {
    let lens = int::decode_block(r, n)?;
    let total = lens
        .iter()
        .try_fold(0usize, |acc, &l| {
            usize::try_from(l).ok().and_then(|l| acc.checked_add(l))
        })
        .filter(|&t| t <= r.remaining())
        .ok_or_else(|| corrupt("string lengths exceed the page"))?;
    let mut bytes = ByteReader::new(r.take(total)?);
    lens.into_iter()
        .map(|l| {
            // `l` fits usize: checked in the sum above.
            let raw = bytes.take(l as usize)?;
            std::str::from_utf8(raw)
                .map(str::to_owned)
                .map_err(|_| corrupt("string is not UTF-8"))
        })
        .collect()
}

pub(crate) fn encode(enc: Encoding, values: &[String], out: &mut Vec<u8>) -> Result<()> {
    match enc {
        Encoding::Plain => put_strings(values.iter().map(String::as_str), out),
        Encoding::Dictionary => {
            let mut dict: Vec<&str> = values.iter().map(String::as_str).collect();
            dict.sort_unstable();
            dict.dedup();
            let indexes = values
                .iter()
                .map(|v| dict.binary_search(&v.as_str()).map(|i| i as u64))
                .collect::<std::result::Result<Vec<u64>, usize>>()
                .map_err(|_| {
                    ColumnarError::Invalid("value missing from its own dictionary".into())
                })?;
            put_varint(out, dict.len() as u64);
            put_strings(dict.iter().copied(), out)?;
            int::encode_block(&indexes, out)
        }
        other => Err(ColumnarError::Invalid(format!(
            "{other:?} is not a text encoding"
        ))),
    }
}

pub(crate) fn decode(enc: Encoding, r: &mut ByteReader<'_>, n: usize) -> Result<Vec<String>> {
    match enc {
        Encoding::Plain => read_strings(r, n),
        Encoding::Dictionary => {
            let dict_len = r.varint_at_most(n, "dictionary size")?;
            let dict = read_strings(r, dict_len)?;
            if dict.windows(2).any(|w| w[0] >= w[1]) {
                return Err(corrupt("dictionary is not sorted and distinct"));
            }
            int::decode_block(r, n)?
                .into_iter()
                .map(|i| {
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| dict.get(i))
                        .cloned()
                        .ok_or_else(|| corrupt("dictionary index out of range"))
                })
                .collect()
        }
        other => Err(corrupt(format!("{other:?} is not a text encoding"))),
    }
}

/// The smaller of plain and dictionary, with its body.
pub(crate) fn encode_best(values: &[String]) -> Result<(Encoding, Vec<u8>)> {
    let mut best: Option<(Encoding, Vec<u8>)> = None;
    for enc in TEXT_ENCODINGS {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf)?;
        if best.as_ref().is_none_or(|(_, b)| buf.len() < b.len()) {
            best = Some((enc, buf));
        }
    }
    best.ok_or_else(|| ColumnarError::Invalid("no text encoding applies".into()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(enc: Encoding, values: &[String]) {
        let mut buf = Vec::new();
        encode(enc, values, &mut buf).unwrap();
        let mut r = ByteReader::new(&buf);
        assert_eq!(
            decode(enc, &mut r, values.len()).unwrap(),
            values,
            "{enc:?}"
        );
        r.finish("strings").unwrap();
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn plain_and_dictionary_round_trip_edge_cases() {
        let cases = vec![
            vec![],
            s(&[""]),
            s(&["", "", ""]),
            s(&["héllo", "日本語", "🦭 sealion", "", "a\0b"]),
            vec!["host_7".to_string(); 1024],
            (0..1024).map(|i| format!("value-{i}")).collect(),
            (0..1024).map(|i| format!("region-{}", i / 300)).collect(),
        ];
        for values in cases {
            for enc in TEXT_ENCODINGS {
                round_trip(enc, &values);
            }
        }
    }

    #[test]
    fn a_sorted_tag_page_is_a_few_bytes() {
        let tags: Vec<String> = (0..1024).map(|i| format!("host_{}", i / 512)).collect();
        let (enc, body) = encode_best(&tags).unwrap();
        assert_eq!(enc, Encoding::Dictionary);
        assert!(body.len() < 64, "{} bytes", body.len());
    }

    #[test]
    fn distinct_strings_stay_plain() {
        let values: Vec<String> = (0..100).map(|i| format!("message {i}")).collect();
        assert_eq!(encode_best(&values).unwrap().0, Encoding::Plain);
    }

    #[test]
    fn decoder_rejects_invalid_utf8_and_unsorted_dictionaries() {
        let mut buf = Vec::new();
        int::encode_block(&[2], &mut buf).unwrap();
        buf.extend_from_slice(&[0xc3, 0x28]);
        assert!(decode(Encoding::Plain, &mut ByteReader::new(&buf), 1).is_err());

        let mut buf = Vec::new();
        put_varint(&mut buf, 2);
        put_strings(["b", "a"].into_iter(), &mut buf).unwrap();
        int::encode_block(&[0, 1], &mut buf).unwrap();
        assert!(decode(Encoding::Dictionary, &mut ByteReader::new(&buf), 2).is_err());
    }

    proptest! {
        #[test]
        fn random_strings_round_trip(
            values in proptest::collection::vec(
                prop_oneof![".{0,12}", "(a|b|c)", Just(String::new())], 0..200),
        ) {
            for enc in TEXT_ENCODINGS {
                round_trip(enc, &values);
            }
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..1100,
        ) {
            for enc in TEXT_ENCODINGS {
                let _ = decode(enc, &mut ByteReader::new(&bytes), n);
            }
        }
    }
}
