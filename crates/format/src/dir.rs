//! Directory formats: the short-form directory kept in the inode's data fork, the directory
//! data block, the name hash, and the record of the directory hash tree.
//!
//! Short-form directory (data fork, Local format; the inode's `size` is its length):
//!
//! | offset | size | field      | meaning                                         |
//! |--------|------|------------|-------------------------------------------------|
//! | 0      | 2    | count      | entries that follow                             |
//! | 2      | 8    | parent     | inode number of the parent directory            |
//! | 10     | ...  | entries    | packed, no padding, tags strictly increasing    |
//!
//! Short-form entry (`12 + name_len` bytes):
//!
//! | offset | size     | field     | meaning                                        |
//! |--------|----------|-----------|------------------------------------------------|
//! | 0      | 1        | name_len  | 1..=255                                        |
//! | 1      | 2        | tag       | readdir cookie the entry keeps for its life    |
//! | 3      | 1        | file_type | `FileType` code                                |
//! | 4      | 8        | inode     | inode number                                   |
//! | 12     | name_len | name      | bytes, no '/' or NUL, not "." or ".."          |
//!
//! Directory data block (magic "CDD1", owner = directory inode), 64-byte header:
//!
//! | offset | size | field          | meaning                                         |
//! |--------|------|----------------|-------------------------------------------------|
//! | 0      | 48   | header         | `MetaHeader`                                    |
//! | 48     | 12   | best_free[3]   | (offset u16, length u16) x 3, see below         |
//! | 60     | 4    | reserved       | zero                                            |
//!
//! `best_free` lists the three largest free regions, largest first (ties: lower offset first);
//! unused slots are (0, 0).
//!
//! From offset 64 the block is tiled, without gaps, by 8-byte aligned regions:
//!
//! - entry (`align8(12 + name_len)` bytes): file_type u8 @0, name_len u8 @1, inode u64 @2
//!   (non-zero), name @10, zero padding, tag u16 in the last 2 bytes = the entry's offset;
//! - free region (multiple of 8 bytes, >= 8): 0xffff u16 @0, length u16 @2, tag u16 in the
//!   last 2 bytes = the region's offset. Adjacent free regions are always merged. The first
//!   byte tells the two apart: 0xff is never a file type code.
//!
//! An entry's data address is `(data block index << 13) | (offset / 8)`: 13 bits cover the
//! 8-byte slots of a 64 KiB block, leaving 19 bits (`DIR_DATA_BLOCK_BITS`) of block index.
//!
//! Name hash: `crc32c(name)` (Castagnoli polynomial, initial value 0, as the `crc32c` crate
//! computes it). Stable across versions; changing it is an incompatible format change.
//!
//! Directory hash tree record (8 bytes): hash u32 @0, data address u32 @4. Key: hash u32.

use std::collections::BTreeSet;

use crate::FormatError;
use crate::geometry::Geometry;
use crate::header::{HEADER_SIZE, MetaHeader};
use crate::inode::FileType;
use crate::limits::{DIR_DATA_BLOCK_BITS, DIR_INLINE_ENTRIES_MAX, NAME_LEN_MAX};
use crate::ondisk::{
    OnDisk, bad_field, check_zero, get_u8, get_u16, get_u32, get_u64, need, put_u8, put_u16,
    put_u32, put_u64,
};
use crate::types::NULL_BLOCK;

const SHORTFORM: &str = "short-form directory";
const DATA: &str = "directory data block";
pub const SHORTFORM_HEADER_BYTES: usize = 10;
const SHORTFORM_ENTRY_BYTES: usize = 12;
/// Size of the data block header; entries start here.
pub const DIR_DATA_HEADER_SIZE: usize = 64;
const FREE_TAG: u16 = 0xffff;
const ADDRESS_OFFSET_BITS: u32 = 32 - DIR_DATA_BLOCK_BITS;

/// Checks a directory entry name: 1..=255 bytes, no '/' or NUL, not "." or "..".
pub fn check_name(name: &[u8]) -> Result<(), FormatError> {
    let bad = |why| {
        bad_field(
            "directory entry",
            NULL_BLOCK,
            "name",
            name.len() as u64,
            why,
        )
    };
    if name.is_empty() || name.len() > NAME_LEN_MAX {
        return Err(bad("name length outside 1..=NAME_LEN_MAX"));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(bad("name contains '/' or NUL"));
    }
    if name == b"." || name == b".." {
        return Err(bad("'.' and '..' are not stored"));
    }
    Ok(())
}

/// The stable 32-bit hash of a name that orders the directory and xattr hash trees.
pub fn name_hash(name: &[u8]) -> u32 {
    crc32c::crc32c(name)
}

/// One entry of a short-form directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortformEntry {
    pub tag: u16,
    pub file_type: FileType,
    pub inode: u64,
    pub name: Vec<u8>,
}

/// A short-form directory: the parent and the entries, in tag order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortformDir {
    pub parent: u64,
    pub entries: Vec<ShortformEntry>,
}

impl ShortformDir {
    /// Bytes the encoded directory takes (the directory inode's `size`).
    pub fn encoded_len(&self) -> usize {
        let names: usize = self.entries.iter().map(|e| e.name.len()).sum();
        SHORTFORM_HEADER_BYTES + SHORTFORM_ENTRY_BYTES * self.entries.len() + names
    }

    /// Encodes after validating every entry (the same rules `decode` applies).
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        self.validate()?;
        let mut out = vec![0u8; self.encoded_len()];
        put_u16(&mut out, 0, self.entries.len() as u16);
        put_u64(&mut out, 2, self.parent);
        let mut at = SHORTFORM_HEADER_BYTES;
        for entry in &self.entries {
            put_u8(&mut out, at, entry.name.len() as u8);
            put_u16(&mut out, at + 1, entry.tag);
            put_u8(&mut out, at + 3, entry.file_type.code());
            put_u64(&mut out, at + 4, entry.inode);
            let name_at = at + SHORTFORM_ENTRY_BYTES;
            out[name_at..name_at + entry.name.len()].copy_from_slice(&entry.name);
            at = name_at + entry.name.len();
        }
        Ok(out)
    }

    /// Decodes and validates `raw`, which must be exactly the directory's bytes.
    pub fn decode(raw: &[u8]) -> Result<ShortformDir, FormatError> {
        need(SHORTFORM, raw, SHORTFORM_HEADER_BYTES)?;
        let bad = |field, value: u64, why| bad_field(SHORTFORM, NULL_BLOCK, field, value, why);
        let count = usize::from(get_u16(raw, 0));
        if count > DIR_INLINE_ENTRIES_MAX {
            return Err(bad(
                "count",
                count as u64,
                "more than DIR_INLINE_ENTRIES_MAX",
            ));
        }
        let parent = get_u64(raw, 2);
        let mut entries = Vec::with_capacity(count);
        let mut at = SHORTFORM_HEADER_BYTES;
        for _ in 0..count {
            need(SHORTFORM, raw, at + SHORTFORM_ENTRY_BYTES)?;
            let name_len = usize::from(get_u8(raw, at));
            let code = get_u8(raw, at + 3);
            let file_type = FileType::from_code(code)
                .ok_or_else(|| bad("file_type", code.into(), "unknown file type code"))?;
            let name_at = at + SHORTFORM_ENTRY_BYTES;
            need(SHORTFORM, raw, name_at + name_len)?;
            entries.push(ShortformEntry {
                tag: get_u16(raw, at + 1),
                file_type,
                inode: get_u64(raw, at + 4),
                name: raw[name_at..name_at + name_len].to_vec(),
            });
            at = name_at + name_len;
        }
        if at != raw.len() {
            return Err(bad("size", raw.len() as u64, "disagrees with the entries"));
        }
        let dir = ShortformDir { parent, entries };
        dir.validate()?;
        Ok(dir)
    }

    fn validate(&self) -> Result<(), FormatError> {
        let bad = |field, value: u64, why| bad_field(SHORTFORM, NULL_BLOCK, field, value, why);
        if self.entries.len() > DIR_INLINE_ENTRIES_MAX {
            let count = self.entries.len() as u64;
            return Err(bad("count", count, "more than DIR_INLINE_ENTRIES_MAX"));
        }
        if self.parent == 0 {
            return Err(bad("parent", 0, "no parent inode"));
        }
        let mut names = BTreeSet::new();
        let mut last_tag = None;
        for entry in &self.entries {
            check_name(&entry.name)?;
            if entry.inode == 0 {
                return Err(bad("inode", 0, "entry names no inode"));
            }
            if last_tag.is_some_and(|last| entry.tag <= last) {
                return Err(bad("tag", entry.tag.into(), "tags not strictly increasing"));
            }
            last_tag = Some(entry.tag);
            if !names.insert(entry.name.as_slice()) {
                return Err(bad("name", entry.name.len() as u64, "duplicate name"));
            }
        }
        Ok(())
    }

    /// Checks that the parent and every entry name an inode that can exist under `geometry`.
    pub fn check(&self, geometry: &Geometry) -> Result<(), FormatError> {
        let bad = |field, value, why| bad_field(SHORTFORM, NULL_BLOCK, field, value, why);
        if !geometry.inode_is_valid(self.parent) {
            return Err(bad(
                "parent",
                self.parent,
                "not an inode of this filesystem",
            ));
        }
        for entry in &self.entries {
            if !geometry.inode_is_valid(entry.inode) {
                return Err(bad("inode", entry.inode, "not an inode of this filesystem"));
            }
        }
        Ok(())
    }
}

/// A free region of a directory data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreeRegion {
    pub offset: u16,
    pub length: u16,
}

/// The decoded directory data block header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirDataHeader {
    pub header: MetaHeader,
    /// The three largest free regions, largest first; unused slots are (0, 0).
    pub best_free: [FreeRegion; 3],
}

impl OnDisk for DirDataHeader {
    const SIZE: usize = DIR_DATA_HEADER_SIZE;
    const NAME: &'static str = DATA;

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        for (index, region) in self.best_free.iter().enumerate() {
            put_u16(out, HEADER_SIZE + 4 * index, region.offset);
            put_u16(out, HEADER_SIZE + 4 * index + 2, region.length);
        }
        put_u32(out, 60, 0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let mut best_free = [FreeRegion::default(); 3];
        for (index, region) in best_free.iter_mut().enumerate() {
            region.offset = get_u16(raw, HEADER_SIZE + 4 * index);
            region.length = get_u16(raw, HEADER_SIZE + 4 * index + 2);
        }
        Ok(Self {
            header: MetaHeader::decode(raw)?,
            best_free,
        })
    }
}

/// One live entry of a directory data block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirDataEntry {
    pub offset: u16,
    pub inode: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

/// Bytes an entry with a name of `name_len` bytes takes in a data block.
pub const fn dir_entry_bytes(name_len: usize) -> usize {
    (12 + name_len).next_multiple_of(8)
}

/// The data address of the entry at `offset` in data block `block_index`, or `None` if the
/// block index or offset cannot be encoded.
pub fn dir_address(block_index: u32, offset: u16) -> Option<u32> {
    let fits = block_index < (1 << DIR_DATA_BLOCK_BITS) && offset.is_multiple_of(8);
    fits.then(|| (block_index << ADDRESS_OFFSET_BITS) | u32::from(offset / 8))
}

/// Splits a data address into data block index and entry offset.
pub fn split_dir_address(address: u32) -> (u32, u16) {
    let offset = (address & ((1 << ADDRESS_OFFSET_BITS) - 1)) * 8;
    (address >> ADDRESS_OFFSET_BITS, offset as u16)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Entry { offset: usize, length: usize },
    Free { offset: usize, length: usize },
}

fn data_bad(block: &[u8], field: &'static str, value: u64, why: &'static str) -> FormatError {
    let at = if block.len() >= HEADER_SIZE {
        get_u64(block, 8)
    } else {
        NULL_BLOCK
    };
    bad_field(DATA, at, field, value, why)
}

/// Checks that a data block's size can be tiled by regions.
fn check_data_size(block: &[u8]) -> Result<(), FormatError> {
    need(DATA, block, DIR_DATA_HEADER_SIZE)?;
    if block.len() > 1 << 16 || !block.len().is_multiple_of(8) {
        return Err(data_bad(
            block,
            "size",
            block.len() as u64,
            "not a directory block size",
        ));
    }
    Ok(())
}

/// The regions of a data block in offset order, read without allocating; each is checked to
/// fit the block and to carry its tag, so the walk stops with an error where the tiling breaks.
struct RegionWalk<'a> {
    block: &'a [u8],
    at: usize,
}

impl<'a> RegionWalk<'a> {
    fn new(block: &'a [u8]) -> Result<Self, FormatError> {
        check_data_size(block)?;
        Ok(Self {
            block,
            at: DIR_DATA_HEADER_SIZE,
        })
    }
}

/// The region starting at `at` (8-aligned, inside the body), checked to fit and be tagged.
fn region_at(block: &[u8], at: usize) -> Result<Region, FormatError> {
    // `at` is 8-aligned and the block length a multiple of 8, so 8 bytes remain.
    let region = if get_u16(block, at) == FREE_TAG {
        Region::Free {
            offset: at,
            length: usize::from(get_u16(block, at + 2)),
        }
    } else {
        let name_len = usize::from(get_u8(block, at + 1));
        Region::Entry {
            offset: at,
            length: dir_entry_bytes(name_len),
        }
    };
    let (Region::Free { length, .. } | Region::Entry { length, .. }) = region;
    if length < 8 || !length.is_multiple_of(8) || at + length > block.len() {
        return Err(data_bad(
            block,
            "length",
            length as u64,
            "region misaligned or too long",
        ));
    }
    if usize::from(get_u16(block, at + length - 2)) != at {
        return Err(data_bad(
            block,
            "tag",
            at as u64,
            "tag differs from the region offset",
        ));
    }
    Ok(region)
}

impl Iterator for RegionWalk<'_> {
    type Item = Result<Region, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.block.len() {
            return None;
        }
        let region = region_at(self.block, self.at);
        match region {
            Ok(Region::Entry { length, .. } | Region::Free { length, .. }) => self.at += length,
            // Nothing after a break in the tiling can be located.
            Err(_) => self.at = self.block.len(),
        }
        Some(region)
    }
}

/// A live entry of a data block, borrowed from the block's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirDataEntryRef<'a> {
    pub offset: u16,
    pub inode: u64,
    pub file_type: FileType,
    pub name: &'a [u8],
}

impl DirDataEntryRef<'_> {
    /// The entry with its name copied out of the block.
    pub fn to_owned(&self) -> DirDataEntry {
        DirDataEntry {
            offset: self.offset,
            inode: self.inode,
            file_type: self.file_type,
            name: self.name.to_vec(),
        }
    }
}

fn decode_entry_ref(block: &[u8], offset: usize) -> Result<DirDataEntryRef<'_>, FormatError> {
    let code = get_u8(block, offset);
    let name_len = usize::from(get_u8(block, offset + 1));
    let inode = get_u64(block, offset + 2);
    let file_type = FileType::from_code(code)
        .ok_or_else(|| data_bad(block, "file_type", code.into(), "unknown file type code"))?;
    let name = &block[offset + 10..offset + 10 + name_len];
    check_name(name)?;
    if inode == 0 {
        return Err(data_bad(block, "inode", 0, "entry names no inode"));
    }
    Ok(DirDataEntryRef {
        offset: offset as u16,
        inode,
        file_type,
        name,
    })
}

/// The live entries of a data block in offset order, borrowed, without allocating. Checks
/// each region's fit and each entry as it goes; the block-wide rules (merged free regions,
/// the best-free summary) are `dir_data_check`'s, which a block's read verifier runs once.
pub fn dir_data_iter(
    block: &[u8],
) -> impl Iterator<Item = Result<DirDataEntryRef<'_>, FormatError>> + '_ {
    let walk = RegionWalk::new(block);
    let (walk, failed) = match walk {
        Ok(walk) => (Some(walk), None),
        Err(e) => (None, Some(Err(e))),
    };
    failed.into_iter().chain(
        walk.into_iter()
            .flatten()
            .filter_map(move |region| match region {
                Ok(Region::Entry { offset, .. }) => Some(decode_entry_ref(block, offset)),
                Ok(Region::Free { .. }) => None,
                Err(e) => Some(Err(e)),
            }),
    )
}

/// The live entry at `offset`, if a region starts there and is an entry: found by walking
/// the regions from the start of the body, so an offset inside another region (a corrupt
/// index record) is never read as an entry.
pub fn dir_data_entry_at(
    block: &[u8],
    offset: u16,
) -> Result<Option<DirDataEntryRef<'_>>, FormatError> {
    let target = usize::from(offset);
    for region in RegionWalk::new(block)? {
        match region? {
            Region::Entry { offset, .. } if offset == target => {
                return decode_entry_ref(block, offset).map(Some);
            }
            Region::Entry { offset, .. } | Region::Free { offset, .. } if offset >= target => {
                return Ok(None);
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Checks a data block's whole structure without allocating: the regions tile the body,
/// every entry is valid, free regions are merged and the best-free summary is exact.
pub fn dir_data_check(block: &[u8]) -> Result<(), FormatError> {
    let mut previous_free = false;
    let mut best = BestFree::default();
    for region in RegionWalk::new(block)? {
        match region? {
            Region::Entry { offset, .. } => {
                decode_entry_ref(block, offset)?;
                previous_free = false;
            }
            Region::Free { offset, .. } if previous_free => {
                return Err(data_bad(
                    block,
                    "free",
                    offset as u64,
                    "adjacent free regions",
                ));
            }
            Region::Free { offset, length } => {
                best.offer(offset, length);
                previous_free = true;
            }
        }
    }
    let header = DirDataHeader::decode(block)?;
    check_zero(
        DATA,
        header.header.blkno,
        "pad",
        block,
        60..DIR_DATA_HEADER_SIZE,
    )?;
    if header.best_free != best.0 {
        let largest = u64::from(header.best_free[0].length);
        return Err(data_bad(
            block,
            "best_free",
            largest,
            "disagrees with the free regions",
        ));
    }
    Ok(())
}

/// Repair's reading of a data block that `dir_data_entries` refuses: if its regions still
/// tile the body, every entry that does not decode becomes free space, free regions are
/// merged, the best-free summary is recomputed and the pad zeroed, in `block`. Returns the
/// entries kept (the header's own fields are the caller's to rewrite).
pub fn dir_data_salvage(block: &mut [u8]) -> Result<Vec<DirDataEntry>, FormatError> {
    let mut broken = Vec::new();
    for region in RegionWalk::new(block)? {
        if let Region::Entry { offset, length } = region?
            && decode_entry_ref(block, offset).is_err()
        {
            broken.push((offset, length));
        }
    }
    for (offset, length) in broken {
        write_free(block, offset, length);
    }
    tidy(block)?;
    put_u32(block, 60, 0);
    dir_data_entries(block)
}

/// The live entries of a data block, in offset order, after checking the block's structure
/// (regions tile the body, entries valid, free regions merged, best-free summary exact).
pub fn dir_data_entries(block: &[u8]) -> Result<Vec<DirDataEntry>, FormatError> {
    dir_data_check(block)?;
    dir_data_iter(block)
        .map(|entry| entry.map(|e| e.to_owned()))
        .collect()
}

/// The three largest free regions seen, largest first, equal lengths by offset (so the
/// summary is unique).
#[derive(Debug, Default)]
struct BestFree([FreeRegion; 3]);

impl BestFree {
    fn offer(&mut self, offset: usize, length: usize) {
        let region = FreeRegion {
            offset: offset as u16,
            length: length as u16,
        };
        let ranks_before = |slot: &FreeRegion| {
            slot.length == 0
                || region.length > slot.length
                || (region.length == slot.length && region.offset < slot.offset)
        };
        if let Some(at) = self.0.iter().position(ranks_before) {
            self.0.copy_within(at..2, at + 1);
            self.0[at] = region;
        }
    }
}

fn write_free(block: &mut [u8], offset: usize, length: usize) {
    block[offset..offset + length].fill(0);
    put_u16(block, offset, FREE_TAG);
    put_u16(block, offset + 2, length as u16);
    put_u16(block, offset + length - 2, offset as u16);
}

/// Merges adjacent free regions and rewrites the best-free summary.
fn tidy(block: &mut [u8]) -> Result<(), FormatError> {
    check_data_size(block)?;
    let mut best = BestFree::default();
    let mut at = DIR_DATA_HEADER_SIZE;
    let mut free_run: Option<(usize, usize)> = None;
    while at < block.len() {
        let region = region_at(block, at)?;
        match region {
            Region::Free { offset, length } => {
                if let Some((start, run)) = free_run {
                    write_free(block, start, run + length);
                    free_run = Some((start, run + length));
                } else {
                    free_run = Some((offset, length));
                }
                at = offset + length;
            }
            Region::Entry { offset, length } => {
                if let Some((start, run)) = free_run.take() {
                    best.offer(start, run);
                }
                at = offset + length;
            }
        }
    }
    if let Some((start, run)) = free_run {
        best.offer(start, run);
    }
    for (index, region) in best.0.iter().enumerate() {
        put_u16(block, HEADER_SIZE + 4 * index, region.offset);
        put_u16(block, HEADER_SIZE + 4 * index + 2, region.length);
    }
    Ok(())
}

/// The first free region `pick` accepts (given its offset and length), walking in order.
fn first_free<T>(
    block: &[u8],
    mut pick: impl FnMut(usize, usize) -> Option<T>,
) -> Result<Option<T>, FormatError> {
    for region in RegionWalk::new(block)? {
        if let Region::Free { offset, length } = region?
            && let Some(found) = pick(offset, length)
        {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Formats an empty data block: the header, then one free region over the whole body.
pub fn init_dir_data_block(block: &mut [u8], header: MetaHeader) -> Result<(), FormatError> {
    need(DATA, block, DIR_DATA_HEADER_SIZE + 8)?;
    DirDataHeader {
        header,
        best_free: [FreeRegion::default(); 3],
    }
    .encode(block);
    let body = block.len() - DIR_DATA_HEADER_SIZE;
    if body > usize::from(u16::MAX) || !body.is_multiple_of(8) {
        return Err(data_bad(
            block,
            "size",
            block.len() as u64,
            "not a directory block size",
        ));
    }
    write_free(block, DIR_DATA_HEADER_SIZE, body);
    tidy(block)
}

/// Inserts an entry in the first free region that fits. Returns its offset, or `None` when no
/// free region is large enough (the caller then uses another block).
pub fn dir_data_insert(
    block: &mut [u8],
    inode: u64,
    file_type: FileType,
    name: &[u8],
) -> Result<Option<u16>, FormatError> {
    check_name(name)?;
    if inode == 0 {
        return Err(data_bad(block, "inode", 0, "entry names no inode"));
    }
    let needed = dir_entry_bytes(name.len());
    let found = first_free(block, |offset, length| {
        (length >= needed).then_some((offset, length))
    })?;
    let Some((offset, length)) = found else {
        return Ok(None);
    };
    block[offset..offset + needed].fill(0);
    put_u8(block, offset, file_type.code());
    put_u8(block, offset + 1, name.len() as u8);
    put_u64(block, offset + 2, inode);
    block[offset + 10..offset + 10 + name.len()].copy_from_slice(name);
    put_u16(block, offset + needed - 2, offset as u16);
    if length > needed {
        write_free(block, offset + needed, length - needed);
    }
    tidy(block)?;
    Ok(Some(offset as u16))
}

/// Inserts an entry at exactly `offset` (8-aligned, inside the body) if one free region covers
/// the entry's bytes; returns whether it did. Lets a short-form directory moving to blocks keep
/// each entry at the data address its tag already named (so readdir cookies survive the move).
pub fn dir_data_insert_at(
    block: &mut [u8],
    offset: u16,
    inode: u64,
    file_type: FileType,
    name: &[u8],
) -> Result<bool, FormatError> {
    check_name(name)?;
    if inode == 0 {
        return Err(data_bad(block, "inode", 0, "entry names no inode"));
    }
    let at = usize::from(offset);
    let needed = dir_entry_bytes(name.len());
    if at < DIR_DATA_HEADER_SIZE || !at.is_multiple_of(8) {
        return Ok(false);
    }
    let found = first_free(block, |offset, length| {
        (offset <= at && at + needed <= offset + length).then_some((offset, length))
    })?;
    let Some((start, length)) = found else {
        return Ok(false);
    };
    if at > start {
        write_free(block, start, at - start);
    }
    block[at..at + needed].fill(0);
    put_u8(block, at, file_type.code());
    put_u8(block, at + 1, name.len() as u8);
    put_u64(block, at + 2, inode);
    block[at + 10..at + 10 + name.len()].copy_from_slice(name);
    put_u16(block, at + needed - 2, at as u16);
    let end = start + length;
    if end > at + needed {
        write_free(block, at + needed, end - at - needed);
    }
    tidy(block)?;
    Ok(true)
}

/// Removes the entry at `offset`, turning it into free space merged with its neighbours.
pub fn dir_data_remove(block: &mut [u8], offset: u16) -> Result<(), FormatError> {
    let target = usize::from(offset);
    let mut length = None;
    for region in RegionWalk::new(block)? {
        if let Region::Entry {
            offset,
            length: bytes,
        } = region?
            && offset == target
        {
            length = Some(bytes);
            break;
        }
    }
    let Some(length) = length else {
        return Err(data_bad(
            block,
            "offset",
            offset.into(),
            "no entry at this offset",
        ));
    };
    write_free(block, target, length);
    tidy(block)
}

/// A record of the directory hash tree: a name hash and the data address of its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirHashRecord {
    pub hash: u32,
    pub address: u32,
}

impl OnDisk for DirHashRecord {
    const SIZE: usize = 8;
    const NAME: &'static str = "directory hash record";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.hash);
        put_u32(out, 4, self.address);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            hash: get_u32(raw, 0),
            address: get_u32(raw, 4),
        })
    }
}

/// Key of the directory and xattr hash trees: a name hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirHashKey {
    pub hash: u32,
}

impl OnDisk for DirHashKey {
    const SIZE: usize = 4;
    const NAME: &'static str = "directory hash key";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.hash);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            hash: get_u32(raw, 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::MetaKind;
    use crate::testing::{UUID, sample_geometry};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    // Checks that the pad must be zero, and that salvage keeps the entries that decode of a
    // block the verifier refuses (a pad, a wrong summary, a bad entry), making it valid.
    #[test]
    fn salvage_keeps_what_decodes() {
        let mut block = vec![0u8; 1024];
        init_dir_data_block(&mut block, MetaHeader::new(MetaKind::DirData, 9, UUID, 7)).unwrap();
        for (inode, name) in [(70, &b"abc"[..]), (71, b"def"), (72, b"ghi")] {
            dir_data_insert(&mut block, inode, FileType::Regular, name).unwrap();
        }
        let second = dir_data_entries(&block).unwrap()[1].offset as usize;
        block[61] = 1;
        put_u16(&mut block, HEADER_SIZE + 2, 8);
        block[second + 1] = 0;
        assert!(dir_data_entries(&block).is_err());
        let kept = dir_data_salvage(&mut block).unwrap();
        let names: Vec<&[u8]> = kept.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(names, [&b"abc"[..], b"ghi"]);
        assert_eq!(dir_data_entries(&block).unwrap(), kept);
    }

    // Checks placing entries at exact offsets: fits inside a free region, refuses overlaps and
    // offsets inside the header, and the block stays valid.
    #[test]
    fn insert_at_exact_offsets() {
        let mut block = vec![0u8; 4096];
        let header = MetaHeader::new(MetaKind::DirData, 9, UUID, 7);
        init_dir_data_block(&mut block, header).unwrap();
        assert!(dir_data_insert_at(&mut block, 200, 70, FileType::Regular, b"abc").unwrap());
        assert!(dir_data_insert_at(&mut block, 120, 71, FileType::Directory, b"x").unwrap());
        assert!(!dir_data_insert_at(&mut block, 208, 72, FileType::Regular, b"y").unwrap());
        assert!(!dir_data_insert_at(&mut block, 8, 72, FileType::Regular, b"y").unwrap());
        assert!(dir_data_insert_at(&mut block, 4080, 73, FileType::Regular, b"z").unwrap());
        let entries = dir_data_entries(&block).unwrap();
        let offsets: Vec<u16> = entries.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, vec![120, 200, 4080]);
        assert_eq!(entries[1].name, b"abc");
        dir_data_remove(&mut block, 200).unwrap();
        assert_eq!(dir_data_entries(&block).unwrap().len(), 2);
    }

    fn entry(tag: u16, name: &str, inode: u64) -> ShortformEntry {
        ShortformEntry {
            tag,
            file_type: FileType::Regular,
            inode,
            name: name.as_bytes().to_vec(),
        }
    }

    // Checks the short-form byte layout and that bad names and orders are refused.
    #[test]
    fn shortform_layout_and_validation() {
        let dir = ShortformDir {
            parent: 64,
            entries: vec![entry(3, "a", 65), entry(4, "bc", 66)],
        };
        let raw = dir.encode().unwrap();
        assert_eq!(raw.len(), 10 + 13 + 14);
        assert_eq!(raw[10], 1);
        assert_eq!(&raw[22..23], b"a");
        assert_eq!(ShortformDir::decode(&raw).unwrap(), dir);
        assert!(dir.check(&sample_geometry()).is_ok());
        assert!(ShortformDir::decode(&raw[..raw.len() - 1]).is_err());
        for bad in [
            vec![entry(3, "a", 65), entry(3, "b", 66)],
            vec![entry(3, "a", 65), entry(4, "a", 66)],
            vec![entry(3, "..", 65)],
            vec![entry(3, "a/b", 65)],
            vec![entry(3, "", 65)],
            vec![entry(3, "x", 0)],
        ] {
            assert!(
                ShortformDir {
                    parent: 64,
                    entries: bad
                }
                .encode()
                .is_err()
            );
        }
        let empty = ShortformDir {
            parent: 64,
            entries: vec![],
        };
        assert_eq!(
            ShortformDir::decode(&empty.encode().unwrap()).unwrap(),
            empty
        );
    }

    // Checks data addresses and the name hash's stability.
    #[test]
    fn addresses_and_hash() {
        let address = dir_address(5, 64).unwrap();
        assert_eq!(split_dir_address(address), (5, 64));
        assert_eq!(dir_address(1 << DIR_DATA_BLOCK_BITS, 64), None);
        assert_eq!(dir_address(0, 65), None);
        // Known CRC32C check value: crc32c("123456789") = 0xe3069283.
        assert_eq!(name_hash(b"123456789"), 0xe306_9283);
    }

    // Checks that a data block with an inode whose low bits are all ones is not free space.
    #[test]
    fn inode_low_bits_do_not_look_free() {
        let mut block = vec![0u8; 512];
        init_dir_data_block(&mut block, MetaHeader::new(MetaKind::DirData, 9, UUID, 64)).unwrap();
        let at = dir_data_insert(&mut block, 0xffff_ffff, FileType::Directory, b"d").unwrap();
        let entries = dir_data_entries(&block).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].offset, at.unwrap());
        assert_eq!(entries[0].inode, 0xffff_ffff);
    }

    // The borrowed reads agree with the model: the iterator lists its entries, each entry's
    // offset finds it and an offset inside an entry finds none, and the best-free summary is
    // the three largest free regions (counted here by sorting, not by the code under test).
    fn check_borrowed_reads(
        block: &[u8],
        model: &BTreeMap<u16, (Vec<u8>, u64)>,
    ) -> Result<(), TestCaseError> {
        let listed: Vec<(u16, Vec<u8>, u64)> = dir_data_iter(block)
            .map(|e| e.map(|e| (e.offset, e.name.to_vec(), e.inode)))
            .collect::<Result<_, _>>()
            .unwrap();
        let expected: Vec<(u16, Vec<u8>, u64)> = model
            .iter()
            .map(|(at, (n, i))| (*at, n.clone(), *i))
            .collect();
        prop_assert_eq!(listed, expected);
        for (at, (name, _)) in model {
            let found = dir_data_entry_at(block, *at).unwrap().unwrap();
            prop_assert_eq!(found.name, name.as_slice());
            prop_assert!(
                dir_data_entry_at(block, *at + 8)
                    .unwrap()
                    .is_none_or(|e| e.offset == *at + 8)
            );
        }
        let mut free: Vec<FreeRegion> = RegionWalk::new(block)
            .unwrap()
            .filter_map(|r| match r.unwrap() {
                Region::Free { offset, length } => Some(FreeRegion {
                    offset: offset as u16,
                    length: length as u16,
                }),
                Region::Entry { .. } => None,
            })
            .collect();
        free.sort_by(|a, b| b.length.cmp(&a.length).then(a.offset.cmp(&b.offset)));
        free.resize(3, FreeRegion::default());
        prop_assert_eq!(
            &DirDataHeader::decode(block).unwrap().best_free[..],
            &free[..3]
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        // Runs insert/remove sequences on a data block and a BTreeMap model, comparing the
        // live entries and re-verifying the block after every step.
        #[test]
        fn data_block_matches_model(
            ops in proptest::collection::vec((any::<bool>(), 1usize..40, 0u8..26), 1..80),
        ) {
            let mut block = vec![0u8; 1024];
            let header = MetaHeader::new(MetaKind::DirData, 9, UUID, 64);
            init_dir_data_block(&mut block, header).unwrap();
            let mut model: BTreeMap<u16, (Vec<u8>, u64)> = BTreeMap::new();
            for (step, (insert, len, letter)) in ops.into_iter().enumerate() {
                if insert || model.is_empty() {
                    let name = vec![b'a' + letter; len];
                    let inode = 64 + step as u64;
                    let kind = FileType::Regular;
                    if let Some(at) = dir_data_insert(&mut block, inode, kind, &name).unwrap() {
                        prop_assert!(model.insert(at, (name, inode)).is_none());
                    }
                } else {
                    let victim = *model.keys().nth(len % model.len()).unwrap();
                    dir_data_remove(&mut block, victim).unwrap();
                    model.remove(&victim);
                }
                let live: BTreeMap<u16, (Vec<u8>, u64)> = dir_data_entries(&block)
                    .unwrap()
                    .into_iter()
                    .map(|e| (e.offset, (e.name, e.inode)))
                    .collect();
                prop_assert_eq!(&live, &model);
                check_borrowed_reads(&block, &model)?;
            }
            for at in model.keys() {
                dir_data_remove(&mut block, *at).unwrap();
            }
            let header = DirDataHeader::decode(&block).unwrap();
            prop_assert_eq!(header.best_free[0], FreeRegion { offset: 64, length: 960 });
        }

        #[test]
        fn shortform_round_trip(
            names in proptest::collection::btree_set("[a-z.]{1,20}", 0..12),
            parent in 1u64..1 << 40,
        ) {
            let entries: Vec<ShortformEntry> = names
                .into_iter()
                .filter(|n| n != "." && n != "..")
                .enumerate()
                .map(|(i, n)| entry(2 * i as u16 + 3, &n, 100 + i as u64))
                .collect();
            let dir = ShortformDir { parent, entries };
            let raw = dir.encode().unwrap();
            prop_assert_eq!(raw.len(), dir.encoded_len());
            prop_assert_eq!(ShortformDir::decode(&raw).unwrap(), dir);
        }

        #[test]
        fn hash_record_round_trip(hash: u32, address: u32, lsn: u64, best: [u16; 6]) {
            let record = DirHashRecord { hash, address };
            prop_assert_eq!(DirHashRecord::decode(&record.to_bytes()).unwrap(), record);
            let key = DirHashKey { hash };
            prop_assert_eq!(DirHashKey::decode(&key.to_bytes()).unwrap(), key);
            let mut header = MetaHeader::new(MetaKind::DirData, 1, UUID, 2);
            header.lsn = crate::types::Lsn(lsn);
            let region = |i: usize| FreeRegion { offset: best[2 * i], length: best[2 * i + 1] };
            let best_free = [region(0), region(1), region(2)];
            let data = DirDataHeader { header, best_free };
            prop_assert_eq!(DirDataHeader::decode(&data.to_bytes()).unwrap(), data);
        }

        #[test]
        fn dir_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = ShortformDir::decode(&raw);
            let _ = dir_data_entries(&raw);
            let _ = dir_data_check(&raw);
            let _ = dir_data_iter(&raw).count();
            let _ = dir_data_entry_at(&raw, 64);
            let mut block = raw.clone();
            let _ = dir_data_insert(&mut block, 70, FileType::Fifo, b"x");
            let _ = dir_data_remove(&mut block, 64);
            let _ = DirHashRecord::decode(&raw);
        }
    }
}
