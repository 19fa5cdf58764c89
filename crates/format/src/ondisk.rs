//! The `OnDisk` codec trait and the little-endian field helpers every codec uses.
//!
//! Codecs read and write fields at explicit byte offsets; nothing is transmuted. Sizes of
//! fixed-size structures are asserted at compile time in `sizes.rs`.

use crate::FormatError;

/// A fixed-size on-disk structure with a little-endian codec.
pub trait OnDisk: Sized {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Name used in error messages.
    const NAME: &'static str;

    /// Writes the structure into `out[..SIZE]`. `out` must be at least `SIZE` bytes.
    fn encode(&self, out: &mut [u8]);

    /// Reads and validates the structure from `raw[..SIZE]`. Never panics on any input.
    fn decode(raw: &[u8]) -> Result<Self, FormatError>;

    /// Encodes into a fresh vector of exactly `SIZE` bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; Self::SIZE];
        self.encode(&mut out);
        out
    }
}

/// Fails with `TooShort` unless `raw` holds at least `needed` bytes.
#[inline]
pub fn need(structure: &'static str, raw: &[u8], needed: usize) -> Result<(), FormatError> {
    if raw.len() < needed {
        return Err(FormatError::TooShort {
            structure,
            needed,
            found: raw.len(),
        });
    }
    Ok(())
}

/// Reads a little-endian `u16` at `at`. The caller has checked the length with `need`.
#[inline]
pub fn get_u16(raw: &[u8], at: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&raw[at..at + 2]);
    u16::from_le_bytes(b)
}

#[inline]
pub fn get_u32(raw: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&raw[at..at + 4]);
    u32::from_le_bytes(b)
}

#[inline]
pub fn get_u64(raw: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    u64::from_le_bytes(b)
}

#[inline]
pub fn get_i64(raw: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    i64::from_le_bytes(b)
}

#[inline]
pub fn get_bytes<const N: usize>(raw: &[u8], at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    b.copy_from_slice(&raw[at..at + N]);
    b
}

#[inline]
pub fn put_u16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_i64(out: &mut [u8], at: usize, v: i64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put_bytes(out: &mut [u8], at: usize, v: &[u8]) {
    out[at..at + v.len()].copy_from_slice(v);
}

/// Builds the `BadField` error every codec reports for a rejected field.
#[cold]
pub fn bad_field(
    structure: &'static str,
    block: u64,
    field: &'static str,
    value: u64,
    why: &'static str,
) -> FormatError {
    FormatError::BadField {
        structure,
        block,
        field,
        value,
        why,
    }
}

/// Checks that the reserved or spare bytes `range` of `raw` are zero (docs/format.md,
/// "Reserved fields"): a nonzero byte is damage, or a feature this code does not know.
/// The error's value is the offset of the first nonzero byte.
pub fn check_zero(
    structure: &'static str,
    block: u64,
    field: &'static str,
    raw: &[u8],
    range: std::ops::Range<usize>,
) -> Result<(), FormatError> {
    let bytes = raw.get(range.clone()).unwrap_or_default();
    match bytes.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(at) => Err(bad_field(
            structure,
            block,
            field,
            (range.start + at) as u64,
            "reserved bytes are not zero",
        )),
    }
}

/// Reads a byte at `at`. The caller has checked the length with `need`.
#[inline]
pub fn get_u8(raw: &[u8], at: usize) -> u8 {
    raw[at]
}

#[inline]
pub fn put_u8(out: &mut [u8], at: usize, v: u8) {
    out[at] = v;
}
