//! Bounds-checked byte and bit readers, a bit writer, and bit-packing of `u64`
//! values at any width from 0 to 64.
//!
//! Why this module exists: every page decoder reads bytes that came from disk
//! or the network, so every read must be able to fail. The readers here are
//! the only place that indexes into encoded bytes; the decoders above them use
//! `?` and never slice by hand. Nothing here may panic on any input.
//!
//! The `bitpacking` crate packs only `u32` lanes; timestamps in nanoseconds
//! and wide integer ranges need up to 64 bits, so a small `u64` packer lives
//! here. Bits are written least significant first, bytes little-endian.
//!
//! There is no zigzag step: signed values are mapped to unsigned ones by
//! flipping the sign bit ([`signed_key`]), which keeps their order, and then
//! frame-of-reference subtracts the minimum. The width that needs is never
//! larger than zigzag's (the range `max - min` is at most twice the largest
//! magnitude, which is what zigzag encodes).

use super::error::{Result, corrupt};

const SIGN_BIT: u64 = 1 << 63;

/// Maps an `i64` to a `u64` with the same order (`i64::MIN` -> 0, `-1` ->
/// `2^63 - 1`, `0` -> `2^63`). Wrapping differences are unchanged by the
/// mapping, so deltas computed on keys equal deltas of the originals.
#[inline]
pub fn signed_key(v: i64) -> u64 {
    (v as u64) ^ SIGN_BIT
}

/// Inverse of [`signed_key`].
#[inline]
pub fn from_signed_key(k: u64) -> i64 {
    (k ^ SIGN_BIT) as i64
}

/// The number of bits needed to hold `v` (0 for 0, 64 for values >= 2^63).
#[inline]
pub fn width_of(v: u64) -> u8 {
    (64 - v.leading_zeros()) as u8
}

#[inline]
pub fn mask(width: u8) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// Bytes taken by `n` values packed at `width` bits, or `None` on overflow
/// (only reachable with corrupt counts).
#[inline]
pub fn packed_len(n: usize, width: u8) -> Option<usize> {
    n.checked_mul(usize::from(width))?
        .checked_add(7)
        .map(|b| b / 8)
}

/// A reader over encoded bytes that fails instead of reading past the end.
pub struct ByteReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| corrupt(format!("truncated: need {n} bytes at offset {}", self.pos)))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let bytes = self.take(N)?;
        <[u8; N]>::try_from(bytes).map_err(|_| corrupt("short read"))
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// LEB128. Rejects encodings longer than 10 bytes and overflowing ones.
    pub fn varint(&mut self) -> Result<u64> {
        let mut out = 0u64;
        for i in 0..10u32 {
            let b = self.u8()?;
            let part = u64::from(b & 0x7f);
            if i == 9 && part > 1 {
                return Err(corrupt("varint overflows u64"));
            }
            out |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(corrupt("varint longer than 10 bytes"))
    }

    /// A varint that must fit `limit`; used for counts read from a page.
    pub fn varint_at_most(&mut self, limit: usize, what: &str) -> Result<usize> {
        let v = self.varint()?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= limit)
            .ok_or_else(|| corrupt(format!("{what} {v} exceeds limit {limit}")))
    }

    /// Fails if any bytes are left: a decoder must consume its input exactly.
    pub fn finish(self, what: &str) -> Result<()> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(corrupt(format!(
                "{} trailing bytes after {what}",
                self.buf.len() - self.pos
            )))
        }
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn varint_len(v: u64) -> usize {
    usize::from(width_of(v)).max(1).div_ceil(7)
}

/// Writes values of any width 0..=64, least significant bit first.
pub struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u128,
    nbits: u32,
}

impl<'a> BitWriter<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            out,
            acc: 0,
            nbits: 0,
        }
    }

    /// Appends the low `width` bits of `v`.
    #[inline]
    pub fn write(&mut self, v: u64, width: u8) {
        if width == 0 {
            return;
        }
        self.acc |= u128::from(v & mask(width)) << self.nbits;
        self.nbits += u32::from(width);
        if self.nbits >= 64 {
            self.out.extend_from_slice(&(self.acc as u64).to_le_bytes());
            self.acc >>= 64;
            self.nbits -= 64;
        }
    }

    #[inline]
    pub fn write_bit(&mut self, bit: bool) {
        self.write(u64::from(bit), 1);
    }

    /// Flushes the last partial byte (padded with zero bits).
    pub fn finish(self) {
        let bytes = self.nbits.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
    }
}

/// The 128 bits starting at bit offset `bit` (at least 121 of them real;
/// bits past the end of `bytes` read as zero). Callers check lengths first
/// (see [`unpack`], [`BitReader`]) or after (Gorilla's decoder).
#[inline]
pub fn peek128(bytes: &[u8], bit: usize) -> u128 {
    let byte = bit / 8;
    let shift = (bit % 8) as u32;
    let word = match bytes.get(byte..byte + 16).map(<[u8; 16]>::try_from) {
        Some(Ok(w)) => u128::from_le_bytes(w),
        _ => {
            let mut w = [0u8; 16];
            for (i, slot) in w.iter_mut().enumerate() {
                *slot = bytes.get(byte + i).copied().unwrap_or(0);
            }
            u128::from_le_bytes(w)
        }
    };
    word >> shift
}

/// Reads `width` bits at bit offset `bit`; bits past the end read as zero.
#[inline]
fn bits_at(bytes: &[u8], bit: usize, width: u8) -> u64 {
    (peek128(bytes, bit) as u64) & mask(width)
}

/// Checks that a bit stream of `bytes` that ended at bit `end` has no
/// trailing bytes and zero padding: one canonical encoding per value list.
pub fn check_stream_end(bytes: &[u8], end: usize) -> Result<()> {
    let total = bytes.len() * 8;
    if end > total {
        return Err(corrupt("bit stream truncated"));
    }
    if total - end >= 8 {
        return Err(corrupt("trailing bytes after bit stream"));
    }
    if !end.is_multiple_of(8) {
        let last = bytes.last().copied().unwrap_or(0);
        if last >> (end % 8) != 0 {
            return Err(corrupt("nonzero padding bits"));
        }
    }
    Ok(())
}

/// Packs every value at `width` bits. Values wider than `width` are truncated,
/// so callers compute the width from the data.
pub fn pack(values: impl IntoIterator<Item = u64>, width: u8, out: &mut Vec<u8>) {
    if width == 0 {
        return;
    }
    let mut w = BitWriter::new(out);
    for v in values {
        w.write(v, width);
    }
    w.finish();
}

/// Reads `n` values packed at `width` bits from `r`, adding `base` (wrapping)
/// to each: frame-of-reference decoding in one pass.
pub fn unpack(
    r: &mut ByteReader<'_>,
    n: usize,
    width: u8,
    base: u64,
    out: &mut Vec<u64>,
) -> Result<()> {
    if width > 64 {
        return Err(corrupt(format!("bit width {width} exceeds 64")));
    }
    let len = packed_len(n, width).ok_or_else(|| corrupt("packed length overflows"))?;
    let bytes = r.take(len)?;
    out.reserve(n);
    if width == 0 {
        out.extend(std::iter::repeat_n(base, n));
        return Ok(());
    }
    let w = usize::from(width);
    if width <= 56 {
        // Fast path: one unaligned 8-byte load per value while 8 bytes
        // remain (a value of <= 56 bits at a bit shift <= 7 fits in 64).
        let m = mask(width);
        let fast = if bytes.len() >= 8 {
            n.min(((bytes.len() - 8) * 8) / w + 1)
        } else {
            0
        };
        out.extend((0..fast).map(|i| {
            let bit = i * w;
            let word = match bytes.get(bit / 8..bit / 8 + 8).map(<[u8; 8]>::try_from) {
                Some(Ok(b)) => u64::from_le_bytes(b),
                _ => 0, // unreachable: `fast` keeps the load in bounds
            };
            ((word >> (bit % 8)) & m).wrapping_add(base)
        }));
        out.extend((fast..n).map(|i| bits_at(bytes, i * w, width).wrapping_add(base)));
    } else {
        out.extend((0..n).map(|i| bits_at(bytes, i * w, width).wrapping_add(base)));
    }
    // Padding bits in the last byte must be zero: a canonical encoding, so a
    // flipped padding bit is not silently accepted.
    let used = n * w;
    if !used.is_multiple_of(8) {
        let last = bytes.last().copied().unwrap_or(0);
        if last >> (used % 8) != 0 {
            return Err(corrupt("nonzero padding bits"));
        }
    }
    Ok(())
}

/// A reader of single values of varying width: the reference against which
/// [`BitWriter`] is tested. The decoders themselves read through [`unpack`]
/// and [`peek128`], which take one bounds check per value or per page.
#[cfg(test)]
pub struct BitReader<'a> {
    bytes: &'a [u8],
    bit: usize,
}

#[cfg(test)]
impl<'a> BitReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, bit: 0 }
    }

    #[inline]
    pub fn read(&mut self, width: u8) -> Result<u64> {
        if width > 64 {
            return Err(corrupt(format!("bit width {width} exceeds 64")));
        }
        let end = self.bit + usize::from(width);
        if end > self.bytes.len() * 8 {
            return Err(corrupt("bit stream truncated"));
        }
        let v = bits_at(self.bytes, self.bit, width);
        self.bit = end;
        Ok(v)
    }

    /// Fails unless the stream ends in the last byte and its padding is zero.
    pub fn finish(self) -> Result<()> {
        check_stream_end(self.bytes, self.bit)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn signed_key_preserves_order_and_round_trips() {
        let vals = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX];
        for pair in vals.windows(2) {
            assert!(signed_key(pair[0]) < signed_key(pair[1]));
        }
        for v in vals {
            assert_eq!(from_signed_key(signed_key(v)), v);
        }
    }

    #[test]
    fn width_of_edges() {
        assert_eq!(width_of(0), 0);
        assert_eq!(width_of(1), 1);
        assert_eq!(width_of(255), 8);
        assert_eq!(width_of(256), 9);
        assert_eq!(width_of(u64::MAX), 64);
    }

    #[test]
    fn varint_round_trips_and_rejects_overlong() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v));
            let mut r = ByteReader::new(&buf);
            assert_eq!(r.varint().unwrap(), v);
            r.finish("varint").unwrap();
        }
        // 11 continuation bytes, and a 10th byte that overflows.
        assert!(ByteReader::new(&[0x80; 11]).varint().is_err());
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(ByteReader::new(&over).varint().is_err());
    }

    #[test]
    fn byte_reader_errors_past_the_end() {
        let mut r = ByteReader::new(&[1, 2, 3]);
        assert!(r.u32().is_err());
        assert_eq!(r.u16().unwrap(), 0x0201);
        assert!(r.u16().is_err());
        assert!(r.take(usize::MAX).is_err());
    }

    #[test]
    fn unpack_rejects_short_input_and_dirty_padding() {
        let mut buf = Vec::new();
        pack([1, 2, 3], 3, &mut buf);
        assert_eq!(buf.len(), 2);
        let mut out = Vec::new();
        assert!(unpack(&mut ByteReader::new(&buf[..1]), 3, 3, 0, &mut out).is_err());
        let mut dirty = buf.clone();
        dirty[1] |= 0x80;
        assert!(unpack(&mut ByteReader::new(&dirty), 3, 3, 0, &mut out).is_err());
        assert!(unpack(&mut ByteReader::new(&buf), 1, 65, 0, &mut out).is_err());
    }

    proptest! {
        #[test]
        fn pack_unpack_round_trips_at_every_width(
            width in 0u8..=64,
            raw in proptest::collection::vec(any::<u64>(), 0..300),
            base in any::<u64>(),
        ) {
            let values: Vec<u64> = raw.iter().map(|v| v & mask(width)).collect();
            let mut buf = Vec::new();
            pack(values.iter().copied(), width, &mut buf);
            prop_assert_eq!(buf.len(), packed_len(values.len(), width).unwrap());
            let mut r = ByteReader::new(&buf);
            let mut out = Vec::new();
            unpack(&mut r, values.len(), width, base, &mut out).unwrap();
            r.finish("packed").unwrap();
            let expected: Vec<u64> = values.iter().map(|v| v.wrapping_add(base)).collect();
            prop_assert_eq!(out, expected);
        }

        #[test]
        fn bit_writer_and_reader_agree_on_mixed_widths(
            items in proptest::collection::vec((any::<u64>(), 0u8..=64), 0..200),
        ) {
            let mut buf = Vec::new();
            let mut w = BitWriter::new(&mut buf);
            for &(v, width) in &items {
                w.write(v, width);
            }
            w.finish();
            let mut r = BitReader::new(&buf);
            for &(v, width) in &items {
                prop_assert_eq!(r.read(width).unwrap(), v & mask(width));
            }
            r.finish().unwrap();
        }
    }
}
