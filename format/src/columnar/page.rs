//! The page envelope: header, statistics, null mask, compression, checksums.
//!
//! Why this module exists: it is the one place that knows the byte layout of
//! a page (documented in the parent module) and the order of checks on read:
//! checksum first, then every header field against its limits, then the
//! payload, which must be consumed exactly. The per-type codecs below it never
//! see a byte that has not passed the page checksum.

use std::borrow::Cow;
use std::cell::RefCell;

use super::bits::{ByteReader, from_signed_key, signed_key};
use super::error::{ColumnarError, Result, corrupt};
use super::stats::{self, NonNull};
use super::{
    ColumnType, ColumnValues, Compression, EncodeOptions, Encoding, MAX_PAGE_PAYLOAD_BYTES,
    MAX_PAGE_VALUES, PAGE_FORMAT_VERSION, PAGE_MAGIC, Page, PageHeader, PageStats, bitmap, float,
    int, text,
};

const ZSTD_LEVEL: i32 = 3;

fn invalid(msg: impl Into<String>) -> ColumnarError {
    ColumnarError::Invalid(msg.into())
}

/// The non-null values of `values`, borrowed when there are no nulls.
fn non_null<'a, T: Clone>(values: &'a [T], nulls: Option<&[bool]>) -> Cow<'a, [T]> {
    match nulls {
        Some(mask) if mask.iter().any(|&n| n) => Cow::Owned(
            values
                .iter()
                .zip(mask)
                .filter(|&(_, &n)| !n)
                .map(|(v, _)| v.clone())
                .collect(),
        ),
        _ => Cow::Borrowed(values),
    }
}

fn encode_ints(keys: &[u64], forced: Option<Encoding>) -> Result<(Encoding, Vec<u8>)> {
    let enc = match forced {
        Some(enc) => enc,
        None => int::IntAnalysis::new(keys).best().0,
    };
    let mut body = Vec::new();
    int::encode(enc, keys, &mut body)?;
    Ok((enc, body))
}

fn encode_values<T>(
    values: &[T],
    forced: Option<Encoding>,
    encode: impl Fn(Encoding, &[T], &mut Vec<u8>) -> Result<()>,
    best: impl Fn(&[T]) -> Result<(Encoding, Vec<u8>)>,
) -> Result<(Encoding, Vec<u8>)> {
    match forced {
        Some(enc) => {
            let mut body = Vec::new();
            encode(enc, values, &mut body)?;
            Ok((enc, body))
        }
        None => best(values),
    }
}

/// Encodes one page: chooses the smallest encoding for its non-null values
/// (or the one `opts` forces), computes its statistics, compresses the payload
/// as `opts` says, and adds the checksums.
///
/// Fails with [`ColumnarError::Invalid`] when the page has more than
/// [`MAX_PAGE_VALUES`] rows, a null mask of the wrong length, a payload over
/// [`MAX_PAGE_PAYLOAD_BYTES`], or a forced encoding that does not fit.
pub fn encode_page(page: &Page, opts: &EncodeOptions) -> Result<Vec<u8>> {
    let count = page.values.len();
    if count > MAX_PAGE_VALUES {
        return Err(invalid(format!(
            "{count} values exceed the page limit of {MAX_PAGE_VALUES}"
        )));
    }
    let mask = page.nulls.as_deref();
    if let Some(m) = mask
        && m.len() != count
    {
        return Err(invalid(format!(
            "null mask has {} entries for {count} values",
            m.len()
        )));
    }
    let null_count = mask.map_or(0, |m| m.iter().filter(|&&n| n).count());
    let column_type = page.values.column_type();
    if let Some(enc) = opts.encoding
        && !column_type.encodings().contains(&enc)
    {
        return Err(invalid(format!(
            "{enc:?} does not apply to {column_type:?} columns"
        )));
    }
    let forced = opts.encoding;

    let (stats, (encoding, body)) = match &page.values {
        ColumnValues::Timestamp(v) | ColumnValues::Int64(v) => {
            let v = non_null(v, mask);
            let nn = if column_type == ColumnType::Timestamp {
                NonNull::Timestamp(&v)
            } else {
                NonNull::Int64(&v)
            };
            let keys: Vec<u64> = v.iter().map(|&x| signed_key(x)).collect();
            (
                stats::compute(nn, count, null_count),
                encode_ints(&keys, forced)?,
            )
        }
        ColumnValues::UInt64(v) => {
            let v = non_null(v, mask);
            (
                stats::compute(NonNull::UInt64(&v), count, null_count),
                encode_ints(&v, forced)?,
            )
        }
        ColumnValues::Float64(v) => {
            let v = non_null(v, mask);
            let body = encode_values(&v, forced, float::encode, float::encode_best)?;
            (
                stats::compute(NonNull::Float64(&v), count, null_count),
                body,
            )
        }
        ColumnValues::Bool(v) => {
            let v = non_null(v, mask);
            let body = encode_values(&v, forced, bitmap::encode, bitmap::encode_best)?;
            (stats::compute(NonNull::Bool(&v), count, null_count), body)
        }
        ColumnValues::Text(v) => {
            let v = non_null(v, mask);
            let body = encode_values(&v, forced, text::encode, text::encode_best)?;
            (stats::compute(NonNull::Text(&v), count, null_count), body)
        }
    };

    let mut raw = Vec::new();
    if null_count > 0
        && let Some(m) = mask
    {
        bitmap::encode_block(m, &mut raw)?;
    }
    raw.extend_from_slice(&body);
    if raw.len() > MAX_PAGE_PAYLOAD_BYTES {
        return Err(invalid(format!(
            "payload of {} bytes exceeds {MAX_PAGE_PAYLOAD_BYTES}",
            raw.len()
        )));
    }

    let (compression, stored) = compress(raw.as_slice(), opts.compression)?;
    let mut out = Vec::with_capacity(64 + stored.len());
    out.extend_from_slice(&PAGE_MAGIC);
    out.push(PAGE_FORMAT_VERSION);
    out.push(column_type.id());
    out.push(encoding.id());
    out.push(compression_id(compression));
    // Both fit in u16: count <= MAX_PAGE_VALUES was checked above.
    out.extend_from_slice(&(count as u16).to_le_bytes());
    out.extend_from_slice(&(null_count as u16).to_le_bytes());
    stats::write(&stats, &mut out);
    // Both fit in u32: at most MAX_PAGE_PAYLOAD_BYTES.
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(&(stored.len() as u32).to_le_bytes());
    let header_crc = crc32c::crc32c(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&stored);
    let page_crc = crc32c::crc32c(&out);
    out.extend_from_slice(&page_crc.to_le_bytes());
    Ok(out)
}

fn compression_id(c: Compression) -> u8 {
    match c {
        Compression::Zstd => 1,
        Compression::Lz4 => 2,
        Compression::None | Compression::Auto => 0,
    }
}

/// Payloads shorter than this are never compressed: a zstd frame's own
/// overhead (about a dozen bytes) and the call cost outweigh any saving.
const MIN_COMPRESS_BYTES: usize = 64;

thread_local! {
    // zstd contexts are costly to create (they dominated page encode time);
    // each thread that encodes or decodes pages keeps one of each.
    static ZSTD_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

fn zstd_compress(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    ZSTD_COMPRESSOR.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if slot.is_none() {
                *slot = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL)?);
            }
            match slot.as_mut() {
                Some(c) => c.compress(raw),
                None => zstd::bulk::compress(raw, ZSTD_LEVEL),
            }
        }
        Err(_) => zstd::bulk::compress(raw, ZSTD_LEVEL),
    })
}

fn zstd_decompress(stored: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    ZSTD_DECOMPRESSOR.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new()?);
            }
            match slot.as_mut() {
                Some(d) => d.decompress(stored, capacity),
                None => zstd::bulk::decompress(stored, capacity),
            }
        }
        Err(_) => zstd::bulk::decompress(stored, capacity),
    })
}

/// Compresses `raw` as `wanted` says; returns the compression kept.
fn compress(raw: &[u8], wanted: Compression) -> Result<(Compression, Cow<'_, [u8]>)> {
    let none = Ok((Compression::None, Cow::Borrowed(raw)));
    if raw.len() < MIN_COMPRESS_BYTES {
        return none;
    }
    let (used, packed) = match wanted {
        Compression::None => return none,
        Compression::Auto | Compression::Zstd => (
            Compression::Zstd,
            zstd_compress(raw).map_err(|e| invalid(format!("zstd: {e}")))?,
        ),
        Compression::Lz4 => (Compression::Lz4, lz4_flex::block::compress(raw)),
    };
    // Auto keeps compression only when it saves at least 10%: below that the
    // decode time is not worth the bytes. An explicit choice keeps any saving.
    let pays = match wanted {
        Compression::Auto => packed.len() * 10 <= raw.len() * 9,
        _ => packed.len() < raw.len(),
    };
    if pays {
        Ok((used, Cow::Owned(packed)))
    } else {
        none
    }
}

fn decompress(c: Compression, stored: &[u8], raw_len: usize) -> Result<Cow<'_, [u8]>> {
    let raw = match c {
        Compression::None | Compression::Auto => Cow::Borrowed(stored),
        Compression::Zstd => Cow::Owned(
            zstd_decompress(stored, raw_len).map_err(|e| corrupt(format!("zstd payload: {e}")))?,
        ),
        Compression::Lz4 => Cow::Owned(
            lz4_flex::block::decompress(stored, raw_len)
                .map_err(|e| corrupt(format!("lz4 payload: {e}")))?,
        ),
    };
    if raw.len() != raw_len {
        return Err(corrupt(format!(
            "payload is {} bytes, header says {raw_len}",
            raw.len()
        )));
    }
    Ok(raw)
}

/// Parses and checks the header at the start of `bytes`, which may be a whole
/// page or only a prefix holding the header. Verifies the header checksum,
/// not the payload's.
pub fn page_header(bytes: &[u8]) -> Result<PageHeader> {
    let mut r = ByteReader::new(bytes);
    if r.take(4)? != PAGE_MAGIC {
        return Err(corrupt("bad page magic"));
    }
    match r.u8()? {
        PAGE_FORMAT_VERSION => {}
        v if v > PAGE_FORMAT_VERSION => return Err(ColumnarError::UnsupportedVersion(v)),
        v => return Err(corrupt(format!("invalid page format version {v}"))),
    }
    let column_type = ColumnType::from_id(r.u8()?)?;
    let encoding = Encoding::from_id(r.u8()?)?;
    if !column_type.encodings().contains(&encoding) {
        return Err(corrupt(format!(
            "{encoding:?} is not an encoding of {column_type:?}"
        )));
    }
    let compression = match r.u8()? {
        0 => Compression::None,
        1 => Compression::Zstd,
        2 => Compression::Lz4,
        other => return Err(corrupt(format!("unknown compression {other}"))),
    };
    let count = usize::from(r.u16()?);
    let null_count = usize::from(r.u16()?);
    if count > MAX_PAGE_VALUES || null_count > count {
        return Err(corrupt(format!("{count} values with {null_count} nulls")));
    }
    let stats = stats::read(column_type, count, null_count, &mut r)?;
    let raw_payload_bytes = r.u32()? as usize;
    let stored_payload_bytes = r.u32()? as usize;
    let crc_end = r.position();
    let stored_crc = r.u32()?;
    let computed = crc32c::crc32c(bytes.get(..crc_end).unwrap_or_default());
    if !crate::checksum_ok(stored_crc, computed) {
        return Err(ColumnarError::Checksum {
            stored: stored_crc,
            computed,
        });
    }
    let consistent = raw_payload_bytes <= MAX_PAGE_PAYLOAD_BYTES
        && match compression {
            Compression::None => stored_payload_bytes == raw_payload_bytes,
            _ => stored_payload_bytes < raw_payload_bytes,
        };
    if !consistent {
        return Err(corrupt(format!(
            "payload lengths {stored_payload_bytes} stored, {raw_payload_bytes} raw do not fit {compression:?}"
        )));
    }
    Ok(PageHeader {
        column_type,
        encoding,
        compression,
        stats,
        raw_payload_bytes,
        stored_payload_bytes,
        header_bytes: r.position(),
    })
}

/// The statistics of a page, from its header alone (see [`page_header`]).
pub fn page_stats(bytes: &[u8]) -> Result<PageStats> {
    page_header(bytes).map(|h| h.stats)
}

/// Fills null slots with `T::default()`.
fn expand<T: Default>(values: Vec<T>, mask: Option<&[bool]>) -> Vec<T> {
    match mask {
        None => values,
        Some(mask) => {
            let mut it = values.into_iter();
            mask.iter()
                .map(|&null| {
                    if null {
                        T::default()
                    } else {
                        it.next().unwrap_or_default()
                    }
                })
                .collect()
        }
    }
}

/// Decodes a whole page. Any damage (a flipped bit, a truncation, trailing
/// bytes) is an error; the checksum over the whole page is checked first.
pub fn decode_page(bytes: &[u8]) -> Result<Page> {
    let split = bytes
        .len()
        .checked_sub(4)
        .ok_or_else(|| corrupt("page shorter than its checksum"))?;
    let (data, crc) = bytes.split_at(split);
    let stored =
        u32::from_le_bytes(<[u8; 4]>::try_from(crc).map_err(|_| corrupt("short checksum"))?);
    let computed = crc32c::crc32c(data);
    if !crate::checksum_ok(stored, computed) {
        return Err(ColumnarError::Checksum { stored, computed });
    }
    let header = page_header(data)?;
    if header.page_bytes() != bytes.len() {
        return Err(corrupt(format!(
            "page is {} bytes, header says {}",
            bytes.len(),
            header.page_bytes()
        )));
    }
    let stored_payload = data.get(header.header_bytes..).unwrap_or_default();
    let raw = decompress(header.compression, stored_payload, header.raw_payload_bytes)?;

    let mut r = ByteReader::new(&raw);
    let count = header.stats.count;
    let null_count = header.stats.null_count;
    let nulls = if null_count > 0 {
        let mask = bitmap::decode_block(&mut r, count)?;
        if mask.iter().filter(|&&n| n).count() != null_count {
            return Err(corrupt("null mask disagrees with the null count"));
        }
        Some(mask)
    } else {
        None
    };
    let n = count - null_count;
    let enc = header.encoding;
    let mask = nulls.as_deref();
    let values = match header.column_type {
        ColumnType::Timestamp | ColumnType::Int64 => {
            let v: Vec<i64> = int::decode(enc, &mut r, n)?
                .into_iter()
                .map(from_signed_key)
                .collect();
            let v = expand(v, mask);
            if header.column_type == ColumnType::Timestamp {
                ColumnValues::Timestamp(v)
            } else {
                ColumnValues::Int64(v)
            }
        }
        ColumnType::UInt64 => ColumnValues::UInt64(expand(int::decode(enc, &mut r, n)?, mask)),
        ColumnType::Float64 => ColumnValues::Float64(expand(float::decode(enc, &mut r, n)?, mask)),
        ColumnType::Bool => ColumnValues::Bool(expand(bitmap::decode(enc, &mut r, n)?, mask)),
        ColumnType::Text => ColumnValues::Text(expand(text::decode(enc, &mut r, n)?, mask)),
    };
    r.finish("page values")?;
    Ok(Page { values, nulls })
}
