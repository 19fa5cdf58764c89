//! The fields of every metadata structure, for fuzzing field by field as xfs_db's `fuzz`
//! verb does: where each field sits in its unit (a block, an inode or a log record header)
//! and how wide it is, down to the bit fields of a packed extent. The offsets are those of
//! `docs/format.md`; the table reads a unit only to find where variable parts (records in
//! use, directory entries, attribute records, fork contents) are.

use cairn_format::MetaKind;
use cairn_format::btree_block::{BTREE_HEADER_SIZE, BtreeLayout};
use cairn_format::dir::dir_data_entries;
use cairn_format::inode::INODE_CORE_SIZE;
use cairn_format::ondisk::{get_u16, get_u32};
use cairn_format::xattr::XATTR_LEAF_HEADER_SIZE;

/// One field: `bits` bits starting at bit `bit` of byte `byte` (little-endian).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub byte: usize,
    pub bit: u32,
    pub bits: u32,
}

/// What a fuzzed field is set to (xfs_db's fuzz verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Zero,
    Ones,
    Plus1,
    Minus1,
    /// A value drawn from this seed.
    Random(u64),
    /// Bit `n` of the field flipped.
    Flip(u32),
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verb::Zero => write!(f, "zero"),
            Verb::Ones => write!(f, "ones"),
            Verb::Plus1 => write!(f, "+1"),
            Verb::Minus1 => write!(f, "-1"),
            Verb::Random(seed) => write!(f, "random({seed})"),
            Verb::Flip(bit) => write!(f, "flip bit {bit}"),
        }
    }
}

/// Bits of the longest field (a packed extent is 128 bits, split into its parts).
const FIELD_BITS_MAX: u32 = 64;

impl Field {
    fn new(name: impl Into<String>, byte: usize, bytes: usize) -> Self {
        Field {
            name: name.into(),
            byte,
            bit: 0,
            bits: 8 * bytes as u32,
        }
    }

    fn bits(name: impl Into<String>, byte: usize, bit: u32, bits: u32) -> Self {
        Field {
            name: name.into(),
            byte,
            bit,
            bits,
        }
    }

    fn end_byte(&self) -> usize {
        self.byte + (self.bit + self.bits).div_ceil(8) as usize
    }

    /// The field's value in `unit`, or `None` if the unit is too short.
    pub fn get(&self, unit: &[u8]) -> Option<u64> {
        let bytes = unit.get(self.byte..self.end_byte())?;
        let mut value = 0u64;
        for index in 0..self.bits {
            let at = self.bit + index;
            if bytes[(at / 8) as usize] & (1 << (at % 8)) != 0 {
                value |= 1 << index;
            }
        }
        Some(value)
    }

    /// Sets the field to `value` (truncated to its width); false if the unit is too short.
    pub fn set(&self, unit: &mut [u8], value: u64) -> bool {
        let Some(bytes) = unit.get_mut(self.byte..self.end_byte()) else {
            return false;
        };
        for index in 0..self.bits {
            let at = self.bit + index;
            let mask = 1u8 << (at % 8);
            if value & (1 << index) != 0 {
                bytes[(at / 8) as usize] |= mask;
            } else {
                bytes[(at / 8) as usize] &= !mask;
            }
        }
        true
    }

    /// The value `verb` gives the field whose value is `old`.
    pub fn apply(&self, verb: Verb, old: u64) -> u64 {
        let mask = if self.bits >= 64 {
            u64::MAX
        } else {
            (1 << self.bits) - 1
        };
        let value = match verb {
            Verb::Zero => 0,
            Verb::Ones => u64::MAX,
            Verb::Plus1 => old.wrapping_add(1),
            Verb::Minus1 => old.wrapping_sub(1),
            Verb::Random(seed) => crate::workload::Rng(seed).next_u64(),
            Verb::Flip(bit) => old ^ (1 << bit.min(63)),
        };
        value & mask
    }

    /// Every verb of the full sweep: the five value verbs, two random values, each bit.
    pub fn all_verbs(&self, seed: u64) -> Vec<Verb> {
        let mut verbs = vec![
            Verb::Zero,
            Verb::Ones,
            Verb::Plus1,
            Verb::Minus1,
            Verb::Random(seed),
            Verb::Random(seed ^ 0x5555),
        ];
        verbs.extend((0..self.bits.min(FIELD_BITS_MAX)).map(Verb::Flip));
        verbs
    }
}

/// A unit that carries its own CRC: a metadata block or inode, or a log record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnitKind {
    Meta(MetaKindKey),
    LogRecord,
}

/// `MetaKind` by its index in `MetaKind::ALL` (so unit kinds sort and hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MetaKindKey(pub usize);

impl MetaKindKey {
    pub fn of(kind: MetaKind) -> Self {
        MetaKindKey(MetaKind::ALL.iter().position(|k| *k == kind).unwrap_or(0))
    }

    pub fn kind(self) -> MetaKind {
        MetaKind::ALL[self.0]
    }
}

impl UnitKind {
    pub fn name(self) -> &'static str {
        match self {
            UnitKind::Meta(key) => key.kind().name(),
            UnitKind::LogRecord => "log record",
        }
    }
}

/// The common metadata header's fields.
fn header_fields() -> Vec<Field> {
    vec![
        Field::new("magic", 0, 4),
        Field::new("crc", 4, 4),
        Field::new("blkno", 8, 8),
        Field::new("lsn", 16, 8),
        Field::new("uuid[0..8]", 24, 8),
        Field::new("uuid[8..16]", 32, 8),
        Field::new("owner", 40, 8),
    ]
}

/// Fields of a list of (name, offset, bytes).
fn listed(list: &[(&str, usize, usize)]) -> Vec<Field> {
    list.iter()
        .map(|&(name, byte, bytes)| Field::new(name, byte, bytes))
        .collect()
}

/// Every field of `unit`, a unit of kind `kind`.
pub fn fields_of(kind: UnitKind, unit: &[u8]) -> Vec<Field> {
    let UnitKind::Meta(key) = kind else {
        return log_record_fields();
    };
    let mut fields = header_fields();
    let kind = key.kind();
    let block_size = unit.len();
    fields.extend(match kind {
        MetaKind::Superblock => superblock_fields(block_size),
        MetaKind::Agf => agf_fields(block_size),
        MetaKind::Agi => agi_fields(block_size),
        MetaKind::Agfl => agfl_fields(unit),
        MetaKind::Inode => inode_fields(unit),
        MetaKind::DirData => dir_data_fields(unit),
        MetaKind::AttrBlock => attr_leaf_fields(unit),
        MetaKind::SymlinkBlock => symlink_fields(unit),
        _ => tree_fields(kind, unit),
    });
    fields.retain(|f| f.end_byte() <= unit.len());
    fields
}

fn superblock_fields(block_size: usize) -> Vec<Field> {
    let mut fields = listed(&[
        ("version", 48, 4),
        ("block_size", 52, 4),
        ("sector_size", 56, 4),
        ("inode_size", 60, 4),
        ("block_count", 64, 8),
        ("ag_blocks", 72, 4),
        ("ag_count", 76, 4),
        ("log_start", 80, 8),
        ("log_blocks", 88, 4),
        ("reserved@92", 92, 4),
        ("features_compat", 96, 8),
        ("features_ro_compat", 104, 8),
        ("features_incompat", 112, 8),
        ("root_inode", 120, 8),
        ("free_blocks", 128, 8),
        ("inode_count", 136, 8),
        ("free_inodes", 144, 8),
        ("label[0..8]", 152, 8),
        ("created", 184, 8),
        ("extent_size_hint", 192, 4),
        ("reserved@196", 196, 8),
        ("reserved@248", 248, 8),
    ]);
    fields.push(Field::new("block tail@256", 256, 8));
    fields.push(Field::new("block tail@end", block_size - 8, 8));
    fields
}

fn agf_fields(block_size: usize) -> Vec<Field> {
    let mut fields = listed(&[
        ("ag_number", 48, 4),
        ("ag_length", 52, 4),
        ("bno_root", 56, 4),
        ("bno_levels", 60, 4),
        ("cnt_root", 64, 4),
        ("cnt_levels", 68, 4),
        ("free_blocks", 72, 4),
        ("longest_free", 76, 4),
        ("btree_blocks", 80, 4),
        ("free_list_first", 84, 4),
        ("free_list_last", 88, 4),
        ("free_list_count", 92, 4),
        ("refcount_root", 96, 4),
        ("refcount_levels", 100, 4),
        ("refcount_blocks", 104, 4),
        ("spare@108", 108, 8),
        ("spare@120", 120, 8),
        ("block tail@128", 128, 8),
    ]);
    fields.push(Field::new("block tail@end", block_size - 8, 8));
    fields
}

fn agi_fields(block_size: usize) -> Vec<Field> {
    let mut fields = listed(&[
        ("ag_number", 48, 4),
        ("ag_length", 52, 4),
        ("inode_count", 56, 4),
        ("free_inodes", 60, 4),
        ("ino_root", 64, 4),
        ("ino_levels", 68, 4),
        ("fino_root", 72, 4),
        ("fino_levels", 76, 4),
        ("newest_inode", 80, 4),
        ("reserved@84", 84, 4),
        ("unlinked[0]", 88, 4),
        ("unlinked[63]", 88 + 4 * 63, 4),
        ("spare@344", 344, 8),
        ("spare@376", 376, 8),
        ("block tail@384", 384, 8),
    ]);
    fields.push(Field::new("block tail@end", block_size - 8, 8));
    fields
}

/// The AGFL's first slots, the last slot in use and the first unused one, and the last slot.
fn agfl_fields(unit: &[u8]) -> Vec<Field> {
    let slots = (unit.len() - 48) / 4;
    let used = (0..slots)
        .filter(|&s| get_u32(unit, 48 + 4 * s) != u32::MAX)
        .count();
    let mut chosen = vec![0, 1, used.saturating_sub(1), used, slots - 1];
    chosen.sort_unstable();
    chosen.dedup();
    chosen
        .into_iter()
        .map(|s| Field::new(format!("slot[{s}]"), 48 + 4 * s, 4))
        .collect()
}

/// The in-use record indexes worth fuzzing: first, middle, last, and the first unused slot.
fn sample_slots(count: usize, capacity: usize) -> Vec<usize> {
    let mut slots = vec![0, count / 2, count.saturating_sub(1), count];
    slots.retain(|&s| s < capacity);
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// A tree block: node header, then sample records (leaves) or keys and pointers (nodes).
fn tree_fields(kind: MetaKind, unit: &[u8]) -> Vec<Field> {
    let mut fields = listed(&[
        ("level", 48, 2),
        ("record_count", 50, 2),
        ("reserved@52", 52, 4),
        ("left", 56, 8),
        ("right", 64, 8),
    ]);
    let Some(layout) = BtreeLayout::for_kind(kind, unit.len() as u32) else {
        return fields;
    };
    let level = get_u16(unit, 48);
    let count = usize::from(get_u16(unit, 50));
    if level == 0 {
        for slot in sample_slots(count, layout.leaf_capacity()) {
            let at = BTREE_HEADER_SIZE + slot * layout.record_size;
            fields.extend(record_fields(kind, &format!("rec[{slot}]"), at));
        }
    } else {
        for slot in sample_slots(count, layout.node_capacity()) {
            if let Some(range) = layout.key_range(slot) {
                fields.push(Field::new(format!("key[{slot}]"), range.start, range.len()));
            }
            if let Some(range) = layout.pointer_range(slot) {
                fields.push(Field::new(format!("ptr[{slot}]"), range.start, range.len()));
            }
        }
    }
    fields
}

/// The fields of one leaf record of `kind` at byte `at`.
fn record_fields(kind: MetaKind, name: &str, at: usize) -> Vec<Field> {
    let field = |part: &str, offset: usize, bytes: usize| {
        Field::new(format!("{name}.{part}"), at + offset, bytes)
    };
    match kind {
        MetaKind::BnoBtree | MetaKind::CntBtree => {
            vec![field("start", 0, 4), field("length", 4, 4)]
        }
        MetaKind::InoBtree | MetaKind::FinoBtree => vec![
            field("start", 0, 4),
            field("free_count", 4, 4),
            field("free_mask", 8, 8),
        ],
        MetaKind::BmapBtree => extent_fields(name, at),
        MetaKind::DirBtree => vec![field("hash", 0, 4), field("address", 4, 4)],
        MetaKind::AttrBtree => vec![field("hash", 0, 4), field("seq", 4, 4), field("leaf", 8, 8)],
        MetaKind::RefcountBtree => vec![
            field("start", 0, 4),
            field("length", 4, 4),
            field("refcount", 8, 4),
        ],
        _ => Vec::new(),
    }
}

/// A packed 16-byte extent's parts: length (bits 0..=20), FsBlock (21..=72), logical block
/// (73..=126) and the unwritten flag (127).
fn extent_fields(name: &str, at: usize) -> Vec<Field> {
    vec![
        Field::bits(format!("{name}.length"), at, 0, 21),
        Field::bits(format!("{name}.fs_block"), at + 2, 5, 52),
        Field::bits(format!("{name}.file_block"), at + 9, 1, 54),
        Field::bits(format!("{name}.unwritten"), at + 15, 7, 1),
    ]
}

/// The inode core's fields, then the forks' first parts.
fn inode_fields(unit: &[u8]) -> Vec<Field> {
    let mut fields = listed(&[
        ("mode", 48, 2),
        ("data_format", 50, 1),
        ("attr_format", 51, 1),
        ("uid", 52, 4),
        ("gid", 56, 4),
        ("nlink", 60, 4),
        ("generation", 64, 4),
        ("flags", 68, 4),
        ("size", 72, 8),
        ("block_count", 80, 8),
        ("atime", 88, 8),
        ("mtime", 96, 8),
        ("ctime", 104, 8),
        ("btime", 112, 8),
        ("atime_ns", 120, 4),
        ("mtime_ns", 124, 4),
        ("ctime_ns", 128, 4),
        ("btime_ns", 132, 4),
        ("extent_size_hint", 136, 4),
        ("next_unlinked", 140, 4),
        ("data_extent_count", 144, 4),
        ("attr_extent_count", 148, 2),
        ("attr_offset", 150, 2),
        ("rdev", 152, 4),
        ("project_id", 156, 4),
        ("cow_extent_size_hint", 160, 4),
        ("spare@164", 164, 4),
        ("spare@168", 168, 8),
    ]);
    let literal = INODE_CORE_SIZE;
    let attr_offset = usize::from(get_u16(unit, 150));
    let attr_at = (attr_offset > 0).then(|| literal + 8 * attr_offset);
    fields.extend(fork_fields("data", unit[50], literal, unit));
    if let Some(at) = attr_at {
        match unit[51] {
            // The index form's root: the tree's root and height, and the fill leaf.
            3 => fields.extend([
                Field::bits("attr.index.root", at, 0, 56),
                Field::new("attr.index.levels", at + 7, 1),
                Field::new("attr.index.fill", at + 8, 8),
            ]),
            format => fields.extend(fork_fields("attr", format, at, unit)),
        }
        if unit[51] == 1 {
            fields.extend(short_form_acl_fields(unit, at));
        }
    }
    fields
}

/// The ACL values of a short-form attr fork at byte `at` (entries: namespace u8, name_len
/// u8, value_len u16, name, value; the System namespace is 3).
fn short_form_acl_fields(unit: &[u8], at: usize) -> Vec<Field> {
    let mut fields = Vec::new();
    let count = get_u16(unit, at);
    let mut entry = at + 4;
    for index in 0..count {
        if entry + 4 > unit.len() {
            break;
        }
        let name_len = usize::from(unit[entry + 1]);
        let value_len = usize::from(get_u16(unit, entry + 2));
        let value = entry + 4 + name_len;
        if unit[entry] == 3 {
            fields.extend(acl_fields(&format!("attr.sf[{index}]"), value, value_len));
        }
        entry = value + value_len;
    }
    fields
}

/// A POSIX ACL value of `len` bytes at byte `at`: its version, and the tag, permissions and
/// id of its first, a middle and its last entry.
fn acl_fields(name: &str, at: usize, len: usize) -> Vec<Field> {
    let mut fields = vec![Field::new(format!("{name}.acl.version"), at, 4)];
    let count = len.saturating_sub(4) / 8;
    let mut chosen = vec![0, count / 2, count.saturating_sub(1)];
    chosen.retain(|&i| i < count);
    chosen.dedup();
    for index in chosen {
        let entry = at + 4 + 8 * index;
        let part = |what: &str| format!("{name}.acl[{index}].{what}");
        fields.push(Field::new(part("tag"), entry, 2));
        fields.push(Field::new(part("perm"), entry + 2, 2));
        fields.push(Field::new(part("id"), entry + 4, 4));
    }
    fields
}

/// The first parts of a fork of format `format` at byte `at`.
fn fork_fields(fork: &str, format: u8, at: usize, unit: &[u8]) -> Vec<Field> {
    let name = |part: &str| format!("{fork}.{part}");
    match format {
        // Local: a short-form directory (count, parent, first entry), attributes (count,
        // total, first entry) or a symlink target (its first bytes).
        1 => vec![
            Field::new(name("local[0..2]"), at, 2),
            Field::new(name("local[2..4]"), at + 2, 2),
            Field::new(name("local[2..10]"), at + 2, 8),
            Field::new(name("local[10..12]"), at + 10, 2),
            Field::new(name("local[12..14]"), at + 12, 2),
            Field::new(name("local[14..22]"), at + 14, 8),
        ],
        2 => extent_fields(&name("extent[0]"), at),
        3 => {
            let end = if fork == "data" && get_u16(unit, 150) > 0 {
                INODE_CORE_SIZE + 8 * usize::from(get_u16(unit, 150))
            } else {
                unit.len()
            };
            let capacity = (end.saturating_sub(at + 8)) / 16;
            vec![
                Field::new(name("root.level"), at, 2),
                Field::new(name("root.count"), at + 2, 2),
                Field::new(name("root.pad"), at + 4, 4),
                Field::new(name("root.key[0]"), at + 8, 8),
                Field::new(name("root.ptr[0]"), at + 8 + 8 * capacity, 8),
            ]
        }
        4 => Vec::new(),
        _ => vec![Field::new(name("first word"), at, 8)],
    }
}

/// A directory data block: best_free, the pad, and the first, a middle and the last entry
/// (the markers are block 0's first entries).
fn dir_data_fields(unit: &[u8]) -> Vec<Field> {
    let mut fields = Vec::new();
    for index in 0..3 {
        let at = 48 + 4 * index;
        fields.push(Field::new(format!("best_free[{index}].offset"), at, 2));
        fields.push(Field::new(format!("best_free[{index}].length"), at + 2, 2));
    }
    fields.push(Field::new("pad@60", 60, 4));
    let Ok(entries) = dir_data_entries(unit) else {
        return fields;
    };
    let count = entries.len();
    let mut chosen = vec![0, 1, 2, count / 2, count.saturating_sub(1)];
    chosen.retain(|&i| i < count);
    chosen.dedup();
    for index in chosen {
        let entry = &entries[index];
        let at = usize::from(entry.offset);
        let length = (12 + entry.name.len()).next_multiple_of(8);
        let name = |part: &str| format!("entry[{index}].{part}");
        fields.push(Field::new(name("file_type"), at, 1));
        fields.push(Field::new(name("name_len"), at + 1, 1));
        fields.push(Field::new(name("inode"), at + 2, 8));
        fields.push(Field::new(name("name[0]"), at + 10, 1));
        fields.push(Field::new(name("tag"), at + length - 2, 2));
    }
    // The first free region after the entries, if any (a free tag 0xffff, then its length).
    if let Some(last) = entries.last() {
        let end = usize::from(last.offset) + (12 + last.name.len()).next_multiple_of(8);
        if end + 4 <= unit.len() && get_u16(unit, end) == 0xffff {
            fields.push(Field::new("free.tag", end, 2));
            fields.push(Field::new("free.length", end + 2, 2));
        }
    }
    fields
}

/// An xattr leaf: count, reserved, used bytes, the first and last table entry and record,
/// and those of every entry of the System namespace (POSIX ACLs) with its value's fields.
fn attr_leaf_fields(unit: &[u8]) -> Vec<Field> {
    let mut fields = listed(&[
        ("count", 48, 2),
        ("reserved@50", 50, 2),
        ("used_bytes", 52, 4),
    ]);
    let count = usize::from(get_u16(unit, 48));
    let entry_slot = |index: usize| XATTR_LEAF_HEADER_SIZE + 12 * index;
    let system = |index: usize| unit.get(entry_slot(index) + 8).is_some_and(|f| f & 3 == 3);
    let mut chosen = vec![0, count.saturating_sub(1)];
    chosen.extend((0..count).filter(|&i| system(i)));
    chosen.sort_unstable();
    chosen.dedup();
    for index in chosen.into_iter().filter(|&i| i < count) {
        let slot = XATTR_LEAF_HEADER_SIZE + 12 * index;
        let name = |part: &str| format!("entry[{index}].{part}");
        fields.push(Field::new(name("hash"), slot, 4));
        fields.push(Field::new(name("offset"), slot + 4, 4));
        fields.push(Field::new(name("flags"), slot + 8, 1));
        fields.push(Field::new(name("pad"), slot + 9, 3));
        let record = get_u32(unit, slot + 4) as usize;
        if record + 6 <= unit.len() {
            let name_len = usize::from(unit[record + 4]);
            fields.push(Field::new(name("value_len"), record, 4));
            fields.push(Field::new(name("name_len"), record + 4, 1));
            fields.push(Field::new(name("name[0]"), record + 5, 1));
            fields.push(Field::new(name("value[0..8]"), record + 5 + name_len, 8));
            let value_len = get_u32(unit, record) as usize;
            let local = unit.get(slot + 8).is_some_and(|f| f & 0x80 == 0);
            if system(index) && local {
                let value = record + 5 + name_len;
                fields.extend(acl_fields(&format!("entry[{index}]"), value, value_len));
            }
        }
    }
    fields
}

fn symlink_fields(unit: &[u8]) -> Vec<Field> {
    let length = get_u32(unit, 52) as usize;
    let end = 56 + length;
    let mut fields = listed(&[("offset", 48, 4), ("length", 52, 4), ("target[0]", 56, 1)]);
    if length > 1 && end <= unit.len() {
        fields.push(Field::new("target[last]", end - 1, 1));
    }
    if end + 8 <= unit.len() {
        fields.push(Field::new("tail", end, 8));
    }
    fields
}

/// A log record header's fields and the first item header of its payload.
fn log_record_fields() -> Vec<Field> {
    listed(&[
        ("magic", 0, 4),
        ("header_crc", 4, 4),
        ("cycle", 8, 4),
        ("flags", 12, 4),
        ("lsn", 16, 8),
        ("prev_lsn", 24, 8),
        ("checkpoint_sequence", 32, 8),
        ("payload_bytes", 40, 4),
        ("payload_crc", 44, 4),
        ("op_count", 48, 4),
        ("reserved@52", 52, 4),
        ("uuid[0..8]", 56, 8),
        ("uuid[8..16]", 64, 8),
        ("tail_lsn", 72, 8),
        ("spare@80", 80, 8),
        ("spare@504", 504, 8),
    ])
}

/// Bytes a log record header unit spans (the header sector).
pub const LOG_HEADER_UNIT_BYTES: usize = cairn_format::log::LOG_RECORD_HEADER_BYTES;

/// Whether the CRC of a unit of `kind` is recomputed after `field` changes (never for the
/// CRC field itself: that mutation is the bad CRC).
pub fn recompute_crc(kind: UnitKind, field: &Field) -> bool {
    match kind {
        UnitKind::Meta(_) => field.name != "crc",
        UnitKind::LogRecord => field.name != "header_crc" && field.name != "payload_crc",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Setting and getting a bit field round-trips and leaves the bits around it alone.
    #[test]
    fn bit_fields_round_trip() {
        let field = Field::bits("f", 2, 5, 52);
        let mut unit = vec![0xa5u8; 16];
        let before = unit.clone();
        let old = field.get(&unit).unwrap();
        assert!(field.set(&mut unit, 0x000f_ffff_ffff_fff0));
        assert_eq!(field.get(&unit).unwrap(), 0x000f_ffff_ffff_fff0);
        assert!(field.set(&mut unit, old));
        assert_eq!(unit, before);
        assert_eq!(field.apply(Verb::Ones, 0), (1 << 52) - 1);
        assert_eq!(field.apply(Verb::Minus1, 0), (1 << 52) - 1);
    }
}
