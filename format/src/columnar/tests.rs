//! Page-level tests: round trips of every encoding on edge cases, random pages
//! against a plain model, corruption and truncation at every byte, encoding
//! choice, and the bytes-per-value report.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

// ---------- a plain model of a page ----------

/// One cell, floats by their bits so that NaN payloads and -0.0 compare exactly.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    I(i64),
    U(u64),
    F(u64),
    B(bool),
    S(String),
}

fn cells(page: &Page) -> Vec<Option<Cell>> {
    let cell = |i: usize| match &page.values {
        ColumnValues::Timestamp(v) | ColumnValues::Int64(v) => Cell::I(v[i]),
        ColumnValues::UInt64(v) => Cell::U(v[i]),
        ColumnValues::Float64(v) => Cell::F(v[i].to_bits()),
        ColumnValues::Bool(v) => Cell::B(v[i]),
        ColumnValues::Text(v) => Cell::S(v[i].clone()),
    };
    (0..page.len())
        .map(|i| (!page.is_null(i)).then(|| cell(i)))
        .collect()
}

/// Asserts that `decoded` is `original` up to the documented normalization:
/// same type and non-null values, nulls `None` when there are none, and the
/// type's default at null slots.
fn assert_round_trip(original: &Page, decoded: &Page) {
    assert_eq!(decoded.values.column_type(), original.values.column_type());
    assert_eq!(cells(decoded), cells(original));
    let any_null = (0..original.len()).any(|i| original.is_null(i));
    assert_eq!(
        decoded.nulls.is_some(),
        any_null,
        "nulls must be None exactly when there are none"
    );
    let placeholder_ok = |i: usize| match &decoded.values {
        ColumnValues::Timestamp(v) | ColumnValues::Int64(v) => v[i] == 0,
        ColumnValues::UInt64(v) => v[i] == 0,
        ColumnValues::Float64(v) => v[i].to_bits() == 0,
        ColumnValues::Bool(v) => !v[i],
        ColumnValues::Text(v) => v[i].is_empty(),
    };
    for i in (0..decoded.len()).filter(|&i| decoded.is_null(i)) {
        assert!(
            placeholder_ok(i),
            "null slot {i} must hold the default value"
        );
    }
}

/// Statistics by a plain pass over the rows, written independently of
/// `stats.rs`.
fn model_stats(page: &Page) -> PageStats {
    let count = page.len();
    let live: Vec<Cell> = cells(page).into_iter().flatten().collect();
    let null_count = count - live.len();
    let mut min: Option<StatValue> = None;
    let mut max: Option<StatValue> = None;
    let mut sum: Option<Sum> = None;
    for c in &live {
        let v = match (c, page.values.column_type()) {
            (Cell::I(x), ColumnType::Timestamp) => StatValue::Timestamp(*x),
            (Cell::I(x), _) => StatValue::Int64(*x),
            (Cell::U(x), _) => StatValue::UInt64(*x),
            (Cell::F(b), _) => StatValue::Float64(f64::from_bits(*b)),
            (Cell::B(x), _) => StatValue::Bool(*x),
            (Cell::S(s), _) => StatValue::Text(s.clone()),
        };
        let less = |a: &StatValue, b: &StatValue| match (a, b) {
            (StatValue::Timestamp(a), StatValue::Timestamp(b))
            | (StatValue::Int64(a), StatValue::Int64(b)) => a < b,
            (StatValue::UInt64(a), StatValue::UInt64(b)) => a < b,
            (StatValue::Float64(a), StatValue::Float64(b)) => a.total_cmp(b).is_lt(),
            (StatValue::Bool(a), StatValue::Bool(b)) => !a & b,
            (StatValue::Text(a), StatValue::Text(b)) => a.as_bytes() < b.as_bytes(),
            _ => unreachable!(),
        };
        if min.as_ref().is_none_or(|m| less(&v, m)) {
            min = Some(v.clone());
        }
        if max.as_ref().is_none_or(|m| less(m, &v)) {
            max = Some(v.clone());
        }
        sum = match (sum, c) {
            (_, Cell::I(_)) if page.values.column_type() == ColumnType::Timestamp => None,
            (None, Cell::I(x)) => Some(Sum::Int(i128::from(*x))),
            (Some(Sum::Int(s)), Cell::I(x)) => Some(Sum::Int(s + i128::from(*x))),
            (None, Cell::U(x)) => Some(Sum::UInt(u128::from(*x))),
            (Some(Sum::UInt(s)), Cell::U(x)) => Some(Sum::UInt(s + u128::from(*x))),
            (None, Cell::F(b)) => Some(Sum::Float(0.0 + f64::from_bits(*b))),
            (Some(Sum::Float(s)), Cell::F(b)) => Some(Sum::Float(s + f64::from_bits(*b))),
            (None, Cell::B(x)) => Some(Sum::UInt(u128::from(*x))),
            (Some(Sum::UInt(s)), Cell::B(x)) => Some(Sum::UInt(s + u128::from(*x))),
            (_, Cell::S(_)) => None,
            (s, c) => unreachable!("{s:?} {c:?}"),
        };
    }
    PageStats {
        count,
        null_count,
        min,
        max,
        sum,
    }
}

/// Stats compared with floats by bits (NaN == NaN when the bits agree).
fn assert_stats_eq(actual: &PageStats, expected: &PageStats) {
    let key = |s: &PageStats| {
        let v = |x: &Option<StatValue>| match x {
            Some(StatValue::Float64(f)) => format!("f{:016x}", f.to_bits()),
            other => format!("{other:?}"),
        };
        let sum = match s.sum {
            Some(Sum::Float(f)) => format!("f{:016x}", f.to_bits()),
            other => format!("{other:?}"),
        };
        (s.count, s.null_count, v(&s.min), v(&s.max), sum)
    };
    assert_eq!(key(actual), key(expected));
}

fn check(page: &Page, opts: &EncodeOptions) -> Vec<u8> {
    let bytes = encode_page(page, opts).unwrap();
    let decoded = decode_page(&bytes).unwrap();
    assert_round_trip(page, &decoded);
    let header = page_header(&bytes).unwrap();
    assert_eq!(header.page_bytes(), bytes.len());
    assert_stats_eq(&header.stats, &model_stats(page));
    assert_stats_eq(&page_stats(&bytes).unwrap(), &model_stats(page));
    if let Some(enc) = opts.encoding {
        assert_eq!(header.encoding, enc);
    }
    bytes
}

// ---------- edge cases ----------

const COMPRESSIONS: [Compression; 4] = [
    Compression::Auto,
    Compression::Zstd,
    Compression::Lz4,
    Compression::None,
];

fn nan_payloads() -> Vec<f64> {
    vec![
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::from_bits(0x7ff8_0000_dead_beef),
        f64::from_bits(0xfff7_ffff_ffff_ffff),
        f64::from_bits(u64::MAX),
    ]
}

fn alternating(n: usize) -> Vec<bool> {
    (0..n).map(|i| i % 2 == 1).collect()
}

/// Edge-case pages of every type; each is also tried all-null and with
/// alternating nulls.
fn edge_pages() -> Vec<Page> {
    let ts_regular: Vec<i64> = (0..1024)
        .map(|i| 1_451_606_400_000_000_000 + i * 10_000_000_000)
        .collect();
    let mut floats_special = nan_payloads();
    floats_special.extend([
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        1.0,
        -1.0,
        f64::MAX,
        f64::MIN,
        5e-324,
    ]);
    let value_sets = vec![
        ColumnValues::Timestamp(vec![]),
        ColumnValues::Timestamp(vec![1]),
        ColumnValues::Timestamp(ts_regular.clone()),
        ColumnValues::Timestamp(vec![i64::MIN, i64::MAX]),
        ColumnValues::Int64(vec![]),
        ColumnValues::Int64(vec![-7]),
        ColumnValues::Int64(vec![i64::MIN, i64::MAX]),
        ColumnValues::Int64(vec![i64::MAX, i64::MIN, 0, -1, i64::MAX]),
        ColumnValues::Int64(vec![42; 1024]),
        ColumnValues::Int64((0..1024).map(|i| (i * 7919) % 1000 - 500).collect()),
        ColumnValues::UInt64(vec![]),
        ColumnValues::UInt64(vec![u64::MAX]),
        ColumnValues::UInt64(vec![0, u64::MAX, 0, u64::MAX]),
        ColumnValues::UInt64(vec![u64::MAX; 1024]),
        ColumnValues::Float64(vec![]),
        ColumnValues::Float64(vec![2.5]),
        ColumnValues::Float64(vec![-0.0]),
        ColumnValues::Float64(vec![-0.0; 1024]),
        ColumnValues::Float64(nan_payloads()),
        ColumnValues::Float64(vec![f64::INFINITY, f64::NEG_INFINITY]),
        ColumnValues::Float64(floats_special.clone()),
        ColumnValues::Float64(vec![1.5; 1024]),
        ColumnValues::Float64((0..1024).map(|i| f64::from(i % 101)).collect()),
        ColumnValues::Float64(vec![-9_007_199_254_740_992.0, 9_007_199_254_740_992.0, 0.0]),
        ColumnValues::Bool(vec![]),
        ColumnValues::Bool(vec![true]),
        ColumnValues::Bool(vec![true; 1024]),
        ColumnValues::Bool(alternating(1024)),
        ColumnValues::Text(vec![]),
        ColumnValues::Text(vec![String::new()]),
        ColumnValues::Text(vec![String::new(); 1024]),
        ColumnValues::Text(
            ["héllo", "日本語", "🦭", "", "a\0b", "héllo"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        ColumnValues::Text((0..1024).map(|i| format!("host_{}", i / 100)).collect()),
    ];
    let mut pages = Vec::new();
    for values in value_sets {
        let n = values.len();
        pages.push(Page::new(values.clone()));
        if n > 0 {
            pages.push(Page::with_nulls(values.clone(), vec![true; n]));
            pages.push(Page::with_nulls(values.clone(), alternating(n)));
            pages.push(Page::with_nulls(values, vec![false; n]));
        }
    }
    pages
}

#[test]
fn every_encoding_and_compression_round_trips_edge_cases() {
    let mut tried = 0;
    for page in edge_pages() {
        for &enc in page.values.column_type().encodings() {
            for compression in COMPRESSIONS {
                let opts = EncodeOptions {
                    compression,
                    encoding: Some(enc),
                };
                match encode_page(&page, &opts) {
                    Ok(_) => {
                        check(&page, &opts);
                        tried += 1;
                    }
                    // Only these encodings depend on the data.
                    Err(ColumnarError::Invalid(_)) => {
                        assert!(
                            matches!(
                                enc,
                                Encoding::Constant
                                    | Encoding::IntegerFloat
                                    | Encoding::RadixFrame
                                    | Encoding::RadixDelta
                            ),
                            "{enc:?} refused {page:?}"
                        )
                    }
                    Err(e) => panic!("{enc:?}: {e}"),
                }
            }
        }
        check(&page, &EncodeOptions::default());
    }
    assert!(tried > 500, "only {tried} combinations ran");
}

#[test]
fn an_empty_page_round_trips_with_no_statistics() {
    let bytes = check(
        &Page::new(ColumnValues::Float64(vec![])),
        &EncodeOptions::default(),
    );
    let stats = page_stats(&bytes).unwrap();
    assert_eq!(
        (
            stats.count,
            stats.null_count,
            stats.min,
            stats.max,
            stats.sum
        ),
        (0, 0, None, None, None)
    );
}

#[test]
fn an_all_null_page_has_counts_but_no_min_max_or_sum() {
    let page = Page::with_nulls(ColumnValues::Int64(vec![5, 6, 7]), vec![true; 3]);
    let stats = page_stats(&check(&page, &EncodeOptions::default())).unwrap();
    assert_eq!((stats.count, stats.null_count), (3, 3));
    assert_eq!((stats.min, stats.max, stats.sum), (None, None, None));
}

#[test]
fn values_at_null_slots_are_ignored_and_decode_as_defaults() {
    let page = Page::with_nulls(
        ColumnValues::Text(vec!["a".into(), "junk".into(), "c".into()]),
        vec![false, true, false],
    );
    let decoded = decode_page(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(
        decoded.values,
        ColumnValues::Text(vec!["a".into(), String::new(), "c".into()])
    );
    assert_eq!(decoded.nulls, Some(vec![false, true, false]));
    let stats = page_stats(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(
        stats.max,
        Some(StatValue::Text("c".into())),
        "a null slot's value must not reach the stats"
    );
}

#[test]
fn float_stats_order_by_total_cmp_and_sum_left_to_right() {
    let page = Page::new(ColumnValues::Float64(vec![1.0, -0.0, 0.0, f64::NAN, -3.0]));
    let stats = page_stats(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(
        stats.min.map(|v| format!("{v:?}")),
        Some("Float64(-3.0)".into())
    );
    assert!(matches!(stats.max, Some(StatValue::Float64(x)) if x.is_nan()));
    assert!(matches!(stats.sum, Some(Sum::Float(x)) if x.is_nan()));
    let zeros = Page::new(ColumnValues::Float64(vec![0.0, -0.0]));
    let stats = page_stats(&encode_page(&zeros, &EncodeOptions::default()).unwrap()).unwrap();
    assert!(matches!(stats.min, Some(StatValue::Float64(x)) if x.to_bits() == (-0.0f64).to_bits()));
}

#[test]
fn integer_sums_do_not_overflow() {
    let page = Page::new(ColumnValues::Int64(vec![i64::MAX; 1024]));
    let stats = page_stats(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(stats.sum, Some(Sum::Int(i128::from(i64::MAX) * 1024)));
    let page = Page::new(ColumnValues::UInt64(vec![u64::MAX; 1024]));
    let stats = page_stats(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(stats.sum, Some(Sum::UInt(u128::from(u64::MAX) * 1024)));
}

// ---------- invalid input on the write side ----------

#[test]
fn more_than_max_page_values_is_an_error() {
    let page = Page::new(ColumnValues::Int64(vec![0; MAX_PAGE_VALUES + 1]));
    assert!(matches!(
        encode_page(&page, &EncodeOptions::default()),
        Err(ColumnarError::Invalid(_))
    ));
    let page = Page::new(ColumnValues::Int64(vec![0; MAX_PAGE_VALUES]));
    assert!(encode_page(&page, &EncodeOptions::default()).is_ok());
}

#[test]
fn a_null_mask_of_the_wrong_length_is_an_error() {
    let page = Page::with_nulls(ColumnValues::Bool(vec![true, false]), vec![false]);
    assert!(matches!(
        encode_page(&page, &EncodeOptions::default()),
        Err(ColumnarError::Invalid(_))
    ));
}

#[test]
fn a_forced_encoding_that_does_not_fit_is_an_error() {
    let ints = Page::new(ColumnValues::Int64(vec![1, 2]));
    for enc in [
        Encoding::Gorilla,
        Encoding::Dictionary,
        Encoding::IntegerFloat,
        Encoding::Constant,
    ] {
        let opts = EncodeOptions {
            encoding: Some(enc),
            ..Default::default()
        };
        assert!(
            matches!(encode_page(&ints, &opts), Err(ColumnarError::Invalid(_))),
            "{enc:?}"
        );
    }
    let floats = Page::new(ColumnValues::Float64(vec![0.5]));
    let opts = EncodeOptions {
        encoding: Some(Encoding::IntegerFloat),
        ..Default::default()
    };
    assert!(matches!(
        encode_page(&floats, &opts),
        Err(ColumnarError::Invalid(_))
    ));
}

// ---------- corruption ----------

/// Recomputes both checksums after a deliberate edit, to reach the decoders
/// with bytes a checksum would otherwise stop.
fn reseal(bytes: &mut [u8], header_crc_at: usize) {
    let crc = crc32c::crc32c(&bytes[..header_crc_at]);
    bytes[header_crc_at..header_crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    let end = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

fn corruption_pages() -> Vec<(Page, EncodeOptions)> {
    let mut rng = Rng(7);
    let floats: Vec<f64> = (0..300).map(|_| rng.f64() * 100.0).collect();
    let walk: Vec<f64> = random_walk(&mut rng, 1024);
    let text: Vec<String> = (0..200)
        .map(|i| format!("msg {} {}", i % 7, "x".repeat(i % 13)))
        .collect();
    let nulls: Vec<bool> = (0..200).map(|i| i % 5 == 0).collect();
    let ints: Vec<i64> = (0..200).map(|i| i * i - 5000).collect();
    let ts: Vec<i64> = (0..1024)
        .map(|i| 1_451_606_400_000_000_000 + i * 10_000_000_000)
        .collect();
    let auto = EncodeOptions::default();
    vec![
        (Page::new(ColumnValues::Timestamp(ts)), auto),
        (Page::new(ColumnValues::Float64(floats)), auto),
        (Page::new(ColumnValues::Float64(walk)), auto),
        (
            Page::with_nulls(ColumnValues::Text(text), nulls.clone()),
            auto,
        ),
        (
            Page::with_nulls(ColumnValues::Int64(ints), nulls.clone()),
            EncodeOptions {
                compression: Compression::Lz4,
                encoding: Some(Encoding::Plain),
            },
        ),
        (
            Page::with_nulls(
                ColumnValues::Bool((0..200).map(|i| i % 3 == 0).collect()),
                nulls,
            ),
            auto,
        ),
    ]
}

#[test]
fn flipping_any_byte_is_an_error_and_never_a_wrong_value() {
    for (page, opts) in corruption_pages() {
        let bytes = encode_page(&page, &opts).unwrap();
        let header = page_header(&bytes).unwrap();
        let stats = header.stats.clone();
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[i] ^= flip;
                assert!(
                    decode_page(&bad).is_err(),
                    "flip {flip:#x} at byte {i} of {} decoded",
                    bytes.len()
                );
                // Stats read the header only: a flip there is an error, a
                // flip in the payload leaves the (verified) stats unchanged.
                match page_stats(&bad) {
                    Ok(s) => {
                        assert!(i >= header.header_bytes, "header flip at {i} accepted");
                        assert_stats_eq(&s, &stats);
                    }
                    Err(_) => assert!(
                        i < header.header_bytes,
                        "payload flip at {i} broke the header"
                    ),
                }
            }
        }
    }
}

#[test]
fn truncation_at_every_length_and_trailing_bytes_are_errors() {
    for (page, opts) in corruption_pages() {
        let bytes = encode_page(&page, &opts).unwrap();
        let header = page_header(&bytes).unwrap();
        for len in 0..bytes.len() {
            assert!(
                decode_page(&bytes[..len]).is_err(),
                "truncated to {len} of {} decoded",
                bytes.len()
            );
            assert_eq!(
                page_stats(&bytes[..len]).is_ok(),
                len >= header.header_bytes,
                "stats of prefix {len}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_page(&longer).is_err());
    }
}

#[test]
fn a_checksum_error_says_so() {
    let mut bytes = encode_page(
        &Page::new(ColumnValues::Int64(vec![1, 2, 3])),
        &EncodeOptions::default(),
    )
    .unwrap();
    let last = bytes.len() - 5;
    bytes[last] ^= 1;
    let err = decode_page(&bytes).unwrap_err();
    assert!(matches!(err, ColumnarError::Checksum { .. }), "{err}");
    assert!(err.is_corruption());
}

#[test]
fn a_newer_format_version_is_refused_by_name() {
    let mut bytes = encode_page(
        &Page::new(ColumnValues::Int64(vec![1])),
        &EncodeOptions::default(),
    )
    .unwrap();
    let header_crc_at = page_header(&bytes).unwrap().header_bytes - 4;
    bytes[4] = PAGE_FORMAT_VERSION + 1;
    reseal(&mut bytes, header_crc_at);
    assert_eq!(
        decode_page(&bytes).unwrap_err(),
        ColumnarError::UnsupportedVersion(PAGE_FORMAT_VERSION + 1)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Bytes that pass both checksums but were edited (as a fuzzer or an
    /// attacker would) must give an error or a page, never a panic.
    #[test]
    fn resealed_random_edits_never_panic(
        which in 0usize..6,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let (page, _) = corruption_pages().swap_remove(which);
        let opts = EncodeOptions { compression: Compression::None, encoding: None };
        let mut bytes = encode_page(&page, &opts).unwrap();
        let header_crc_at = page_header(&bytes).unwrap().header_bytes - 4;
        for (at, value) in edits {
            let i = at.index(bytes.len() - 4);
            bytes[i] = value;
        }
        reseal(&mut bytes, header_crc_at);
        let _ = decode_page(&bytes);
        let _ = page_stats(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = decode_page(&bytes);
        let _ = page_stats(&bytes);
        // The same bytes behind a valid magic and version get further in.
        let mut framed = PAGE_MAGIC.to_vec();
        framed.push(PAGE_FORMAT_VERSION);
        framed.extend_from_slice(&bytes);
        let _ = page_stats(&framed);
    }
}

// ---------- random pages against the model ----------

/// splitmix64: a seeded generator for test data, so that a failing case is
/// reproduced from the seed proptest prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal with mean 0 and standard deviation 1 (sum of uniforms).
    fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.f64()).sum::<f64>() - 6.0
    }
}

/// A TSBS-like cpu metric: a walk with normal steps, clamped to 0..=100 and
/// rounded to an integer, stored as f64.
fn random_walk(rng: &mut Rng, n: usize) -> Vec<f64> {
    let mut x = rng.f64() * 100.0;
    (0..n)
        .map(|_| {
            x = (x + rng.normal()).clamp(0.0, 100.0);
            x.round()
        })
        .collect()
}

fn random_page(ty: u8, len: usize, shape: u8, null_kind: u8, seed: u64) -> Page {
    let mut rng = Rng(seed);
    let ints: Vec<i64> = match shape {
        0 => (0..len).map(|_| rng.next() as i64).collect(),
        1 => (0..len).map(|_| rng.below(100) as i64).collect(),
        2 => {
            let mut v = rng.next() as i64;
            (0..len)
                .map(|_| {
                    if rng.below(50) == 0 {
                        v = rng.below(5) as i64 - 2;
                    }
                    v
                })
                .collect()
        }
        3 => {
            let start = rng.next() as i64 >> 2;
            (0..len as i64)
                .map(|i| start + i * 10_000_000_000 + rng.below(3) as i64 - 1)
                .collect()
        }
        _ => {
            let edges = [i64::MIN, i64::MAX, 0, -1, 1];
            (0..len).map(|_| edges[rng.below(5) as usize]).collect()
        }
    };
    let values = match ty {
        0 => ColumnValues::Timestamp(ints),
        1 => ColumnValues::Int64(ints),
        2 => ColumnValues::UInt64(ints.iter().map(|&v| v as u64).collect()),
        3 => ColumnValues::Float64(match shape {
            0 => (0..len).map(|_| f64::from_bits(rng.next())).collect(),
            1 => random_walk(&mut rng, len),
            2 => (0..len).map(|_| (rng.below(1000) as f64) / 10.0).collect(),
            3 => {
                let mut special = nan_payloads();
                special.extend([f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 3.0, 1e300]);
                (0..len)
                    .map(|_| special[rng.below(special.len() as u64) as usize])
                    .collect()
            }
            _ => ints.iter().map(|&i| i as f64).collect(),
        }),
        4 => ColumnValues::Bool(match shape {
            0 | 1 => (0..len).map(|_| rng.below(2) == 0).collect(),
            _ => ints.iter().map(|&i| i > 0).collect(),
        }),
        _ => {
            const CHARS: [char; 8] = ['a', 'b', 'é', '日', '🦭', '\0', ' ', 'z'];
            let word = |rng: &mut Rng| -> String {
                let n = rng.below(9);
                (0..n)
                    .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
                    .collect()
            };
            ColumnValues::Text(match shape {
                0 | 1 => (0..len).map(|_| word(&mut rng)).collect(),
                _ => ints
                    .iter()
                    .map(|&i| format!("host_{}", i.rem_euclid(7)))
                    .collect(),
            })
        }
    };
    let nulls = match null_kind {
        0 => None,
        1 => Some(vec![false; len]),
        2 => Some((0..len).map(|_| rng.below(5) == 0).collect()),
        3 => Some(vec![true; len]),
        _ => Some(alternating(len)),
    };
    Page { values, nulls }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn random_pages_round_trip_and_stats_match_a_plain_pass(
        ty in 0u8..6,
        len in prop_oneof![0usize..=20, 0usize..=MAX_PAGE_VALUES],
        shape in 0u8..5,
        null_kind in 0u8..5,
        compression in prop::sample::select(COMPRESSIONS.to_vec()),
        seed in any::<u64>(),
    ) {
        let page = random_page(ty, len, shape, null_kind, seed);
        check(&page, &EncodeOptions { compression, encoding: None });
    }
}

// ---------- encoding choice ----------

fn tsbs_timestamps() -> Vec<i64> {
    (0..1024)
        .map(|i| 1_451_606_400_000_000_000 + i * 10_000_000_000)
        .collect()
}

#[test]
fn integer_valued_floats_pick_frame_of_reference_and_cost_well_under_8_bytes() {
    let mut rng = Rng(1);
    let walk = random_walk(&mut rng, 1024);
    let bytes = encode_page(
        &Page::new(ColumnValues::Float64(walk)),
        &EncodeOptions::default(),
    )
    .unwrap();
    assert_eq!(
        page_header(&bytes).unwrap().encoding,
        Encoding::IntegerFloat
    );
    assert!(bytes.len() < 1024, "{} bytes for 1,024 values", bytes.len());

    let spread: Vec<f64> = (0..1024).map(|_| rng.below(101) as f64).collect();
    let bytes = encode_page(
        &Page::new(ColumnValues::Float64(spread)),
        &EncodeOptions::default(),
    )
    .unwrap();
    assert_eq!(
        page_header(&bytes).unwrap().encoding,
        Encoding::IntegerFloat
    );
    assert!(bytes.len() < 1024, "{} bytes for 1,024 values", bytes.len());
}

#[test]
fn a_regular_10s_timestamp_series_is_well_under_a_byte_per_value() {
    let bytes = encode_page(
        &Page::new(ColumnValues::Timestamp(tsbs_timestamps())),
        &EncodeOptions::default(),
    )
    .unwrap();
    let header = page_header(&bytes).unwrap();
    // Frame-of-reference over the deltas packs a constant step at width 0.
    assert_eq!(header.encoding, Encoding::Delta);
    assert!(
        bytes.len() < 100,
        "{} bytes for 1,024 timestamps",
        bytes.len()
    );
}

#[test]
fn random_floats_stay_uncompressed_and_near_8_bytes() {
    let mut rng = Rng(3);
    let values: Vec<f64> = (0..1024).map(|_| rng.f64() * 100.0).collect();
    let bytes = encode_page(
        &Page::new(ColumnValues::Float64(values)),
        &EncodeOptions::default(),
    )
    .unwrap();
    let header = page_header(&bytes).unwrap();
    assert_eq!(
        header.compression,
        Compression::None,
        "zstd cannot save 10% on random mantissas"
    );
    assert!(bytes.len() <= 8 * 1024 + 64);
}

#[test]
fn auto_compression_keeps_zstd_only_when_it_saves_ten_percent() {
    let text: Vec<String> = (0..1024)
        .map(|i| format!("GET /api/v1/items/{} HTTP/1.1 200", i * 3))
        .collect();
    let page = Page::new(ColumnValues::Text(text));
    let header = page_header(&encode_page(&page, &EncodeOptions::default()).unwrap()).unwrap();
    assert_eq!(header.compression, Compression::Zstd);
    assert!(header.stored_payload_bytes * 10 <= header.raw_payload_bytes * 9);
    let lz4 = EncodeOptions {
        compression: Compression::Lz4,
        encoding: None,
    };
    assert_eq!(
        page_header(&encode_page(&page, &lz4).unwrap())
            .unwrap()
            .compression,
        Compression::Lz4
    );
    let none = EncodeOptions {
        compression: Compression::None,
        encoding: None,
    };
    assert_eq!(
        page_header(&encode_page(&page, &none).unwrap())
            .unwrap()
            .compression,
        Compression::None
    );
}

#[test]
fn a_sorted_tag_column_page_is_a_few_dozen_bytes() {
    let tags: Vec<String> = (0..1024)
        .map(|i| format!("host_{}", 40 + i / 600))
        .collect();
    let bytes = encode_page(
        &Page::new(ColumnValues::Text(tags)),
        &EncodeOptions::default(),
    )
    .unwrap();
    assert_eq!(page_header(&bytes).unwrap().encoding, Encoding::Dictionary);
    assert!(bytes.len() < 100, "{} bytes", bytes.len());
}

/// The report asked for in issue 3's first step; run with
/// `cargo test --workspace --lib columnar::tests::report_bytes_per_value -- --nocapture`.
#[test]
fn report_bytes_per_value() {
    let mut rng = Rng(2016);
    let walk = random_walk(&mut rng, 1024);
    let random: Vec<f64> = (0..1024).map(|_| rng.f64() * 100.0).collect();
    let cases = [
        (
            "(a) timestamps, 10 s interval",
            ColumnValues::Timestamp(tsbs_timestamps()),
        ),
        (
            "(b) random walk 0..=100 as f64",
            ColumnValues::Float64(walk),
        ),
        ("(c) random f64 in [0, 100)", ColumnValues::Float64(random)),
    ];
    for (name, values) in cases {
        let bytes = encode_page(&Page::new(values), &EncodeOptions::default()).unwrap();
        let h = page_header(&bytes).unwrap();
        println!(
            "{name}: {:.4} bytes/value ({} bytes for 1,024 values; {:?}, {:?}, header {} bytes)",
            bytes.len() as f64 / 1024.0,
            bytes.len(),
            h.encoding,
            h.compression,
            h.header_bytes,
        );
    }
}
