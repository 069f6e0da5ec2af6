//! Per-tag filters over a sealed partition's tag values.
//!
//! Why this exists: a planner should know, before it contacts any storage
//! node, that a partition cannot hold `host = 'h42'` (lesson 1 of the design
//! brief). Each tag gets a filter over its distinct values; the whole set
//! serializes to a few KiB that meta can hold beside the partition map.
//! A filter answers "maybe" or "certainly not"; it never misses a value that
//! is there.
//!
//! # Format (version 1, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SLTF` |
//! | 1 | version (1) |
//! | 1 | hash id (1 = FNV-1a 64 over the value's UTF-8 bytes) |
//! | 4 | number of tags |
//! | per tag, by name | name length (u16), name, distinct values (u32), kind (u8), payload length (u32), payload |
//! | 4 | CRC32C of every byte before it |
//!
//! Kinds: 0 = exact, the sorted distinct hashes as u64 (used for at most
//! [`EXACT_MAX`] values); 1 = `xorf::BinaryFuse8` over the distinct hashes,
//! payload = 20-byte descriptor (seed u64, segment length u32, segment length
//! mask u32, segment count length u32; xorf's DMA layout) then the
//! fingerprints (false positive rate about 1/256, about 9 bits per value);
//! 2 = no filter (construction failed): every value "may" be there.
//! A tag with no values in the partition has no entry, and a tag without an
//! entry certainly holds no value.

use std::collections::{BTreeMap, BTreeSet};

use xorf::{BinaryFuse8, Descriptor, DmaSerializable, Filter};

use super::format::fnv1a64;

pub const FILTER_MAGIC: [u8; 4] = *b"SLTF";
pub const FILTER_VERSION: u8 = 1;
const HASH_FNV1A64: u8 = 1;

/// Tags with at most this many distinct values store their hashes exactly.
pub const EXACT_MAX: usize = 8;

const KIND_EXACT: u8 = 0;
const KIND_FUSE8: u8 = 1;
const KIND_NONE: u8 = 2;

#[derive(Debug, Clone)]
enum TagFilter {
    /// Sorted distinct hashes.
    Exact(Vec<u64>),
    Fuse(BinaryFuse8),
    /// Anything may be there.
    None,
}

impl TagFilter {
    fn may_contain(&self, hash: u64) -> bool {
        match self {
            TagFilter::Exact(hashes) => hashes.binary_search(&hash).is_ok(),
            TagFilter::Fuse(f) => f.contains(&hash),
            TagFilter::None => true,
        }
    }
}

/// The filters of one partition, one per tag that has values.
#[derive(Debug, Clone, Default)]
pub struct TagFilters {
    tags: BTreeMap<String, (u32, TagFilter)>,
}

impl TagFilters {
    /// Builds filters from each tag's distinct values.
    pub fn build(values: &BTreeMap<String, BTreeSet<String>>) -> TagFilters {
        let mut tags = BTreeMap::new();
        for (tag, vals) in values {
            if vals.is_empty() {
                continue;
            }
            let mut hashes: Vec<u64> = vals.iter().map(|v| fnv1a64(v.as_bytes())).collect();
            hashes.sort_unstable();
            hashes.dedup();
            let filter = if hashes.len() <= EXACT_MAX {
                TagFilter::Exact(hashes)
            } else {
                match BinaryFuse8::try_from(&hashes) {
                    Ok(f) => TagFilter::Fuse(f),
                    Err(_) => TagFilter::None,
                }
            };
            let distinct = u32::try_from(vals.len()).unwrap_or(u32::MAX);
            tags.insert(tag.clone(), (distinct, filter));
        }
        TagFilters { tags }
    }

    /// Whether `tag` may hold `value`; `false` means certainly not.
    pub fn may_contain(&self, tag: &str, value: &str) -> bool {
        match self.tags.get(tag) {
            Some((_, f)) => f.may_contain(fnv1a64(value.as_bytes())),
            None => false,
        }
    }

    /// Tags that have a filter (every tag with at least one value).
    pub fn tags(&self) -> impl Iterator<Item = &str> {
        self.tags.keys().map(String::as_str)
    }

    /// Distinct values of `tag` at seal time (0 when the tag has none).
    pub fn distinct_values(&self, tag: &str) -> u32 {
        self.tags.get(tag).map_or(0, |(n, _)| *n)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&FILTER_MAGIC);
        out.push(FILTER_VERSION);
        out.push(HASH_FNV1A64);
        out.extend_from_slice(&(self.tags.len() as u32).to_le_bytes());
        for (name, (distinct, filter)) in &self.tags {
            // Tag names come from series keys, where they are at most u16::MAX bytes.
            let name_len = u16::try_from(name.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&name_len.to_le_bytes());
            out.extend_from_slice(&name.as_bytes()[..usize::from(name_len)]);
            out.extend_from_slice(&distinct.to_le_bytes());
            let (kind, payload) = match filter {
                TagFilter::Exact(h) => (
                    KIND_EXACT,
                    h.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                ),
                TagFilter::Fuse(f) => {
                    let mut p = vec![0u8; BinaryFuse8::DESCRIPTOR_LEN];
                    f.dma_copy_descriptor_to(&mut p);
                    p.extend_from_slice(f.dma_fingerprints());
                    (KIND_FUSE8, p)
                }
                TagFilter::None => (KIND_NONE, Vec::new()),
            };
            out.push(kind);
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&payload);
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses what [`TagFilters::to_bytes`] wrote; checks the checksum and
    /// every length, so that no input can make a later lookup panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<TagFilters, String> {
        let split = bytes
            .len()
            .checked_sub(4)
            .ok_or("tag filters shorter than their checksum")?;
        let (body, crc) = bytes.split_at(split);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if !crate::checksum_ok(stored, crc32c::crc32c(body)) {
            return Err("tag filter checksum mismatch".into());
        }
        let mut r = Cursor { buf: body };
        if r.take(4)? != FILTER_MAGIC {
            return Err("bad tag filter magic".into());
        }
        let version = r.u8()?;
        if version != FILTER_VERSION {
            return Err(format!("unknown tag filter version {version}"));
        }
        let hash = r.u8()?;
        if hash != HASH_FNV1A64 {
            return Err(format!("unknown tag filter hash {hash}"));
        }
        let count = r.u32()?;
        let mut tags = BTreeMap::new();
        for _ in 0..count {
            let name_len = usize::from(r.u16()?);
            let name = std::str::from_utf8(r.take(name_len)?)
                .map_err(|_| "tag name is not UTF-8")?
                .to_string();
            let distinct = r.u32()?;
            let kind = r.u8()?;
            let len = r.u32()? as usize;
            let payload = r.take(len)?;
            let filter = match kind {
                KIND_EXACT => {
                    if !len.is_multiple_of(8) {
                        return Err("exact tag filter length is not a multiple of 8".into());
                    }
                    let hashes: Vec<u64> = payload
                        .chunks_exact(8)
                        .map(|c| {
                            u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        })
                        .collect();
                    if hashes.windows(2).any(|w| w[0] >= w[1]) {
                        return Err("exact tag filter is not sorted".into());
                    }
                    TagFilter::Exact(hashes)
                }
                KIND_FUSE8 => TagFilter::Fuse(parse_fuse8(payload)?),
                KIND_NONE => TagFilter::None,
                other => return Err(format!("unknown tag filter kind {other}")),
            };
            if tags.insert(name, (distinct, filter)).is_some() {
                return Err("tag filter names repeat".into());
            }
        }
        if !r.buf.is_empty() {
            return Err("trailing bytes after the tag filters".into());
        }
        Ok(TagFilters { tags })
    }
}

/// Rebuilds a `BinaryFuse8` from its DMA form, checking that every index a
/// lookup can compute is inside the fingerprints.
fn parse_fuse8(payload: &[u8]) -> Result<BinaryFuse8, String> {
    let d = BinaryFuse8::DESCRIPTOR_LEN;
    if payload.len() < d {
        return Err("binary fuse filter shorter than its descriptor".into());
    }
    let (desc, fingerprints) = payload.split_at(d);
    let u32_at = |i: usize| u32::from_le_bytes([desc[i], desc[i + 1], desc[i + 2], desc[i + 3]]);
    let seed = u64::from_le_bytes([
        desc[0], desc[1], desc[2], desc[3], desc[4], desc[5], desc[6], desc[7],
    ]);
    let segment_length = u32_at(8);
    let segment_length_mask = u32_at(12);
    let segment_count_length = u32_at(16);
    // A lookup reads fingerprints[h0], [h1], [h2] with h0 < segment_count_length
    // and h2 < segment_count_length + 2 * segment_length (see xorf's hash_of_hash).
    let valid = segment_length.is_power_of_two()
        && segment_length_mask == segment_length - 1
        && segment_count_length.is_multiple_of(segment_length)
        && u64::from(segment_count_length) + 2 * u64::from(segment_length)
            <= fingerprints.len() as u64;
    if !valid {
        return Err("binary fuse filter descriptor does not fit its fingerprints".into());
    }
    Ok(BinaryFuse8 {
        descriptor: Descriptor {
            seed,
            segment_length,
            segment_length_mask,
            segment_count_length,
        },
        fingerprints: fingerprints.to_vec().into_boxed_slice(),
    })
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err("tag filters are truncated".into());
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}
