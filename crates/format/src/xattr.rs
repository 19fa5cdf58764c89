//! Extended attributes: namespaces, the short-form attribute fork kept inline in the inode,
//! and the attribute leaf block (magic "CXA1", owner = the inode).
//!
//! Short-form attribute fork (Local format):
//!
//! | offset | size | field       | meaning                                           |
//! |--------|------|-------------|---------------------------------------------------|
//! | 0      | 2    | count       | entries that follow                               |
//! | 2      | 2    | total_bytes | bytes of the whole short form, header included    |
//! | 4      | ...  | entries     | namespace u8, name_len u8, value_len u16, name, value |
//!
//! Leaf block header (56 bytes):
//!
//! | offset | size | field      | meaning                                            |
//! |--------|------|------------|----------------------------------------------------|
//! | 0      | 48   | header     | `MetaHeader`                                       |
//! | 48     | 2    | count      | entries in the table                               |
//! | 50     | 2    | reserved   | zero                                               |
//! | 52     | 4    | used_bytes | end of the last record; the rest of the block is zero |
//!
//! Entry table from offset 56, 12 bytes per entry, sorted by (hash, namespace, name):
//! hash u32 @0 (`name_hash(name)`), record offset u32 @4, flags u8 @8 (bits 0-1 namespace,
//! bit 7 `REMOTE`), 3 zero bytes. Records follow the table, packed in entry order:
//! value_len u32 @0, name_len u8 @4, name @5, then either the value (local) or, for REMOTE
//! entries, the FsBlock u64 of the first of `ceil(value_len / block_size)` contiguous blocks
//! holding the raw value (written like file data, before the transaction that links it).
//!
//! Index form (Btree attr fork, for more attributes than one leaf holds): the fork holds an
//! `XattrIndexRoot` (16 bytes): word 0 = root FsBlock of the index tree (bits 0..56) and its
//! height (bits 56..64), word 1 = the leaf new attributes go to first (`NULL_BLOCK`: none).
//! The index tree (`CXB1` blocks, a B+tree with FsBlock pointers) holds one
//! `XattrIndexRecord` per attribute: hash u32 @0 (`name_hash` of the name), seq u32 @4
//! (tells apart attributes whose names share a hash), leaf u64 @8 (the `CXA1` leaf block
//! holding the attribute); its key is `XattrIndexKey` (hash, seq), 8 bytes. Leaves in index
//! form are ordinary leaf blocks holding any subset of the attributes, each sorted as above.

use std::collections::BTreeSet;

use crate::FormatError;
use crate::dir::name_hash;
use crate::header::{HEADER_SIZE, MetaHeader};
use crate::limits::{BTREE_LEVELS_MAX, FS_BLOCK_MAX, XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};
use crate::ondisk::{
    OnDisk, bad_field, get_u8, get_u16, get_u32, get_u64, need, put_u8, put_u16, put_u32, put_u64,
};
use crate::types::{FsBlock, NULL_BLOCK};

const SHORTFORM: &str = "short-form xattr fork";
const LEAF: &str = "xattr block";
/// Size of the leaf block header; the entry table starts here.
pub const XATTR_LEAF_HEADER_SIZE: usize = 56;
const LEAF_ENTRY_BYTES: usize = 12;
const FLAG_REMOTE: u8 = 0x80;
const NAMESPACE_MASK: u8 = 0x03;

/// Attribute namespace, stored in the low bits of a flags byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Namespace {
    User = 0,
    Trusted = 1,
    Security = 2,
    System = 3,
}

impl Namespace {
    pub const fn from_code(code: u8) -> Option<Namespace> {
        Some(match code {
            0 => Self::User,
            1 => Self::Trusted,
            2 => Self::Security,
            3 => Self::System,
            _ => return None,
        })
    }
}

/// Checks an attribute name and value length against the limits.
pub fn check_xattr(name: &[u8], value_len: usize) -> Result<(), FormatError> {
    let bad = |field, value: usize, why| bad_field("xattr", NULL_BLOCK, field, value as u64, why);
    if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX {
        return Err(bad(
            "name",
            name.len(),
            "name length outside 1..=XATTR_NAME_LEN_MAX",
        ));
    }
    if value_len > XATTR_VALUE_LEN_MAX {
        return Err(bad("value", value_len, "longer than XATTR_VALUE_LEN_MAX"));
    }
    Ok(())
}

/// An attribute held inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub namespace: Namespace,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

fn check_unique<'a>(
    structure: &'static str,
    keys: impl Iterator<Item = (Namespace, &'a [u8])>,
) -> Result<(), FormatError> {
    let mut seen = BTreeSet::new();
    for (namespace, name) in keys {
        if !seen.insert((namespace, name)) {
            let why = "duplicate attribute";
            return Err(bad_field(
                structure,
                NULL_BLOCK,
                "name",
                name.len() as u64,
                why,
            ));
        }
    }
    Ok(())
}

/// Encodes a short-form attribute fork; fails on bad names, values or duplicates.
pub fn encode_shortform_xattrs(attrs: &[Xattr]) -> Result<Vec<u8>, FormatError> {
    let total: usize = 4 + attrs
        .iter()
        .map(|a| 4 + a.name.len() + a.value.len())
        .sum::<usize>();
    let bad = |field, value: usize, why| bad_field(SHORTFORM, NULL_BLOCK, field, value as u64, why);
    if total > usize::from(u16::MAX) {
        return Err(bad("total_bytes", total, "too large for a short form"));
    }
    for attr in attrs {
        check_xattr(&attr.name, attr.value.len())?;
    }
    check_unique(
        SHORTFORM,
        attrs.iter().map(|a| (a.namespace, a.name.as_slice())),
    )?;
    let mut out = vec![0u8; 4];
    put_u16(&mut out, 0, attrs.len() as u16);
    put_u16(&mut out, 2, total as u16);
    for attr in attrs {
        out.push(attr.namespace as u8);
        out.push(attr.name.len() as u8);
        out.extend_from_slice(&(attr.value.len() as u16).to_le_bytes());
        out.extend_from_slice(&attr.name);
        out.extend_from_slice(&attr.value);
    }
    debug_assert_eq!(out.len(), total);
    Ok(out)
}

/// Decodes a short-form attribute fork (`fork` may be longer than the short form).
pub fn decode_shortform_xattrs(fork: &[u8]) -> Result<Vec<Xattr>, FormatError> {
    need(SHORTFORM, fork, 4)?;
    let bad = |field, value: u64, why| bad_field(SHORTFORM, NULL_BLOCK, field, value, why);
    let count = usize::from(get_u16(fork, 0));
    let total = usize::from(get_u16(fork, 2));
    need(SHORTFORM, fork, total)?;
    let mut attrs = Vec::new();
    let mut at = 4;
    for _ in 0..count {
        need(SHORTFORM, &fork[..total], at + 4)?;
        let code = get_u8(fork, at);
        let namespace = Namespace::from_code(code)
            .ok_or_else(|| bad("namespace", code.into(), "unknown namespace"))?;
        let name_len = usize::from(get_u8(fork, at + 1));
        let value_len = usize::from(get_u16(fork, at + 2));
        let name_at = at + 4;
        need(SHORTFORM, &fork[..total], name_at + name_len + value_len)?;
        let name = fork[name_at..name_at + name_len].to_vec();
        check_xattr(&name, value_len)?;
        let value = fork[name_at + name_len..name_at + name_len + value_len].to_vec();
        attrs.push(Xattr {
            namespace,
            name,
            value,
        });
        at = name_at + name_len + value_len;
    }
    if at != total {
        return Err(bad(
            "total_bytes",
            total as u64,
            "disagrees with the entries",
        ));
    }
    check_unique(
        SHORTFORM,
        attrs.iter().map(|a| (a.namespace, a.name.as_slice())),
    )?;
    Ok(attrs)
}

/// Where a leaf entry's value lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrValue {
    Local(Vec<u8>),
    Remote { block: FsBlock, length: u32 },
}

/// One entry of an attribute leaf block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrLeafEntry {
    pub namespace: Namespace,
    pub name: Vec<u8>,
    pub value: XattrValue,
}

impl XattrLeafEntry {
    fn sort_key(&self) -> (u32, Namespace, &[u8]) {
        (name_hash(&self.name), self.namespace, &self.name)
    }

    fn record_bytes(&self) -> usize {
        5 + self.name.len()
            + match &self.value {
                XattrValue::Local(value) => value.len(),
                XattrValue::Remote { .. } => 8,
            }
    }
}

/// A decoded attribute leaf block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrLeaf {
    pub header: MetaHeader,
    /// Sorted by (hash, namespace, name).
    pub entries: Vec<XattrLeafEntry>,
}

impl XattrLeaf {
    /// Index of the entry `(namespace, name)`.
    pub fn find(&self, namespace: Namespace, name: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.namespace == namespace && e.name == name)
    }

    /// Bytes the encoded block needs (header, table, records).
    pub fn used_bytes(&self) -> usize {
        let records: usize = self.entries.iter().map(XattrLeafEntry::record_bytes).sum();
        XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * self.entries.len() + records
    }

    /// Encodes into a whole block; fails if the entries are invalid, unsorted or do not fit.
    pub fn encode_block(&self, block: &mut [u8]) -> Result<(), FormatError> {
        self.validate()?;
        let used = self.used_bytes();
        need(LEAF, block, used)?;
        block.fill(0);
        self.header.encode(block);
        put_u16(block, HEADER_SIZE, self.entries.len() as u16);
        put_u32(block, 52, used as u32);
        let mut record_at = XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * self.entries.len();
        for (index, entry) in self.entries.iter().enumerate() {
            let slot = XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * index;
            let remote = matches!(entry.value, XattrValue::Remote { .. });
            put_u32(block, slot, name_hash(&entry.name));
            put_u32(block, slot + 4, record_at as u32);
            put_u8(
                block,
                slot + 8,
                entry.namespace as u8 | if remote { FLAG_REMOTE } else { 0 },
            );
            let name_at = record_at + 5;
            put_u8(block, record_at + 4, entry.name.len() as u8);
            block[name_at..name_at + entry.name.len()].copy_from_slice(&entry.name);
            let value_at = name_at + entry.name.len();
            match &entry.value {
                XattrValue::Local(value) => {
                    put_u32(block, record_at, value.len() as u32);
                    block[value_at..value_at + value.len()].copy_from_slice(value);
                }
                XattrValue::Remote {
                    block: start,
                    length,
                } => {
                    put_u32(block, record_at, *length);
                    put_u64(block, value_at, start.0);
                }
            }
            record_at += entry.record_bytes();
        }
        Ok(())
    }

    /// Decodes and validates a whole leaf block (after `verify_header`).
    pub fn decode_block(block: &[u8]) -> Result<XattrLeaf, FormatError> {
        need(LEAF, block, XATTR_LEAF_HEADER_SIZE)?;
        let header = MetaHeader::decode(block)?;
        let bad = |field, value: u64, why| bad_field(LEAF, header.blkno, field, value, why);
        let count = usize::from(get_u16(block, HEADER_SIZE));
        let used = get_u32(block, 52) as usize;
        if get_u16(block, 50) != 0 {
            return Err(bad("reserved", get_u16(block, 50).into(), "must be zero"));
        }
        if used > block.len() || used < XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * count {
            return Err(bad(
                "used_bytes",
                used as u64,
                "outside the block or over the table",
            ));
        }
        let area = &block[..used];
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let slot = XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * index;
            let entry =
                decode_leaf_entry(area, slot).map_err(|why| bad("entry", index as u64, why))?;
            entries.push(entry);
        }
        let leaf = XattrLeaf { header, entries };
        leaf.validate()?;
        if leaf.used_bytes() != used {
            return Err(bad(
                "used_bytes",
                used as u64,
                "records not packed in entry order",
            ));
        }
        Ok(leaf)
    }

    fn validate(&self) -> Result<(), FormatError> {
        let at = self.header.blkno;
        for entry in &self.entries {
            let value_len = match &entry.value {
                XattrValue::Local(value) => value.len(),
                XattrValue::Remote { block, length } => {
                    if *length == 0 || block.0 > FS_BLOCK_MAX {
                        return Err(bad_field(LEAF, at, "remote", block.0, "bad remote value"));
                    }
                    *length as usize
                }
            };
            check_xattr(&entry.name, value_len)?;
        }
        let sorted = self
            .entries
            .windows(2)
            .all(|w| w[0].sort_key() < w[1].sort_key());
        if !sorted {
            let why = "entries not sorted by (hash, namespace, name) or duplicated";
            return Err(bad_field(
                LEAF,
                at,
                "entries",
                self.entries.len() as u64,
                why,
            ));
        }
        Ok(())
    }
}

/// Decodes the entry in table slot `slot`; `area` is the used part of the block.
fn decode_leaf_entry(area: &[u8], slot: usize) -> Result<XattrLeafEntry, &'static str> {
    let hash = get_u32(area, slot);
    let record_at = get_u32(area, slot + 4) as usize;
    let flags = get_u8(area, slot + 8);
    let namespace = Namespace::from_code(flags & NAMESPACE_MASK).ok_or("unknown namespace")?;
    if flags & !(NAMESPACE_MASK | FLAG_REMOTE) != 0 {
        return Err("unknown entry flags");
    }
    if area[slot + 9..slot + LEAF_ENTRY_BYTES]
        .iter()
        .any(|&b| b != 0)
    {
        return Err("reserved bytes are not zero");
    }
    if record_at.checked_add(5).is_none_or(|end| end > area.len()) {
        return Err("record outside the used area");
    }
    let value_len = get_u32(area, record_at);
    let name_at = record_at + 5;
    let name_end = name_at + usize::from(get_u8(area, record_at + 4));
    let name = area
        .get(name_at..name_end)
        .ok_or("name outside the used area")?
        .to_vec();
    if hash != name_hash(&name) {
        return Err("hash does not match the name");
    }
    let value = if flags & FLAG_REMOTE != 0 {
        let raw = area
            .get(name_end..name_end + 8)
            .ok_or("pointer outside the used area")?;
        XattrValue::Remote {
            block: FsBlock(get_u64(raw, 0)),
            length: value_len,
        }
    } else {
        let end = name_end.saturating_add(value_len as usize);
        XattrValue::Local(
            area.get(name_end..end)
                .ok_or("value outside the used area")?
                .to_vec(),
        )
    };
    Ok(XattrLeafEntry {
        namespace,
        name,
        value,
    })
}

/// One attribute's record in the index tree (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrIndexRecord {
    /// `name_hash` of the attribute's name.
    pub hash: u32,
    /// Tells apart the records of names with the same hash.
    pub seq: u32,
    /// The leaf block holding the attribute.
    pub leaf: FsBlock,
}

impl XattrIndexRecord {
    pub fn key(&self) -> XattrIndexKey {
        XattrIndexKey {
            hash: self.hash,
            seq: self.seq,
        }
    }
}

impl OnDisk for XattrIndexRecord {
    const SIZE: usize = 16;
    const NAME: &'static str = "xattr index record";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.hash);
        put_u32(out, 4, self.seq);
        put_u64(out, 8, self.leaf.0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let leaf = get_u64(raw, 8);
        if leaf > FS_BLOCK_MAX {
            let why = "leaf past the largest block";
            return Err(bad_field(Self::NAME, NULL_BLOCK, "leaf", leaf, why));
        }
        Ok(Self {
            hash: get_u32(raw, 0),
            seq: get_u32(raw, 4),
            leaf: FsBlock(leaf),
        })
    }
}

/// The key of the attribute index tree: a name's hash, then its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct XattrIndexKey {
    pub hash: u32,
    pub seq: u32,
}

impl OnDisk for XattrIndexKey {
    const SIZE: usize = 8;
    const NAME: &'static str = "xattr index key";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.hash);
        put_u32(out, 4, self.seq);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            hash: get_u32(raw, 0),
            seq: get_u32(raw, 4),
        })
    }
}

/// The attr fork of the index form: the index tree's root and height, and the leaf that new
/// attributes try first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrIndexRoot {
    pub root: FsBlock,
    pub levels: u32,
    /// `None`: no leaf is known to have room.
    pub fill: Option<FsBlock>,
}

impl OnDisk for XattrIndexRoot {
    const SIZE: usize = 16;
    const NAME: &'static str = "xattr index root";

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.root.0 | u64::from(self.levels) << 56);
        put_u64(out, 8, self.fill.map_or(NULL_BLOCK, |block| block.0));
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let bad = |field, value: u64, why| bad_field(Self::NAME, NULL_BLOCK, field, value, why);
        let word = get_u64(raw, 0);
        let (root, levels) = (word & ((1 << 56) - 1), (word >> 56) as u32);
        if root > FS_BLOCK_MAX {
            return Err(bad("root", root, "past the largest block"));
        }
        if levels == 0 || levels > BTREE_LEVELS_MAX {
            return Err(bad("levels", levels.into(), "outside 1..=BTREE_LEVELS_MAX"));
        }
        let fill = get_u64(raw, 8);
        if fill != NULL_BLOCK && fill > FS_BLOCK_MAX {
            return Err(bad("fill", fill, "past the largest block"));
        }
        Ok(Self {
            root: FsBlock(root),
            levels,
            fill: (fill != NULL_BLOCK).then_some(FsBlock(fill)),
        })
    }
}

/// The leaf block header as a fixed structure (for verifiers that only need the counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrLeafHeader {
    pub header: MetaHeader,
    pub count: u16,
    pub used_bytes: u32,
}

impl OnDisk for XattrLeafHeader {
    const SIZE: usize = XATTR_LEAF_HEADER_SIZE;
    const NAME: &'static str = LEAF;

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u16(out, 48, self.count);
        put_u16(out, 50, 0);
        put_u32(out, 52, self.used_bytes);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let header = MetaHeader::decode(raw)?;
        let count = get_u16(raw, 48);
        let used_bytes = get_u32(raw, 52);
        if (used_bytes as usize) < XATTR_LEAF_HEADER_SIZE + LEAF_ENTRY_BYTES * usize::from(count) {
            let why = "smaller than the entry table";
            return Err(bad_field(
                LEAF,
                header.blkno,
                "used_bytes",
                used_bytes.into(),
                why,
            ));
        }
        Ok(Self {
            header,
            count,
            used_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::MetaKind;
    use crate::testing::UUID;
    use proptest::prelude::*;

    fn attr(namespace: Namespace, name: &str, value: &[u8]) -> Xattr {
        Xattr {
            namespace,
            name: name.as_bytes().to_vec(),
            value: value.to_vec(),
        }
    }

    fn sorted_leaf(mut entries: Vec<XattrLeafEntry>) -> XattrLeaf {
        entries.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        entries.dedup_by(|a, b| a.sort_key() == b.sort_key());
        XattrLeaf {
            header: MetaHeader::new(MetaKind::AttrBlock, 12, UUID, 4160),
            entries,
        }
    }

    // Checks short-form encoding, duplicates, and name/value limits.
    #[test]
    fn shortform_rules() {
        let attrs = vec![
            attr(Namespace::User, "a", b"1"),
            attr(Namespace::Trusted, "a", b""),
        ];
        let raw = encode_shortform_xattrs(&attrs).unwrap();
        assert_eq!(raw.len(), 4 + 6 + 5);
        assert_eq!(decode_shortform_xattrs(&raw).unwrap(), attrs);
        let duplicate = vec![
            attr(Namespace::User, "a", b"1"),
            attr(Namespace::User, "a", b"2"),
        ];
        assert!(encode_shortform_xattrs(&duplicate).is_err());
        assert!(encode_shortform_xattrs(&[attr(Namespace::User, "", b"1")]).is_err());
        assert!(check_xattr(b"x", XATTR_VALUE_LEN_MAX + 1).is_err());
    }

    // Checks a leaf with local and remote values, and that unsorted leaves are refused.
    #[test]
    fn leaf_block_round_trip() {
        let leaf = sorted_leaf(vec![
            XattrLeafEntry {
                namespace: Namespace::Security,
                name: b"selinux".to_vec(),
                value: XattrValue::Local(b"ctx".to_vec()),
            },
            XattrLeafEntry {
                namespace: Namespace::User,
                name: b"big".to_vec(),
                value: XattrValue::Remote {
                    block: FsBlock(777),
                    length: 60_000,
                },
            },
        ]);
        let mut block = vec![0u8; 512];
        leaf.encode_block(&mut block).unwrap();
        assert_eq!(XattrLeaf::decode_block(&block).unwrap(), leaf);
        let header = XattrLeafHeader::decode(&block).unwrap();
        assert_eq!(
            (header.count, header.used_bytes as usize),
            (2, leaf.used_bytes())
        );
        assert_eq!(XattrLeafHeader::decode(&header.to_bytes()).unwrap(), header);
        let mut unsorted = leaf.clone();
        unsorted.entries.reverse();
        assert!(unsorted.encode_block(&mut block).is_err());
    }

    fn any_entry() -> impl Strategy<Value = XattrLeafEntry> {
        let value = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(XattrValue::Local),
            (0u64..=FS_BLOCK_MAX, 1u32..=65_536).prop_map(|(b, l)| XattrValue::Remote {
                block: FsBlock(b),
                length: l
            }),
        ];
        (0u8..4, "[a-z]{1,12}", value).prop_map(|(ns, name, value)| XattrLeafEntry {
            namespace: Namespace::from_code(ns).unwrap_or(Namespace::User),
            name: name.into_bytes(),
            value,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn leaf_round_trip(entries in proptest::collection::vec(any_entry(), 0..30)) {
            let leaf = sorted_leaf(entries);
            let mut block = vec![0u8; 4096];
            leaf.encode_block(&mut block).unwrap();
            prop_assert_eq!(XattrLeaf::decode_block(&block).unwrap(), leaf);
        }

        #[test]
        fn shortform_round_trip(entries in proptest::collection::vec(any_entry(), 0..10)) {
            let mut seen = BTreeSet::new();
            let attrs: Vec<Xattr> = entries
                .into_iter()
                .filter(|e| seen.insert((e.namespace, e.name.clone())))
                .map(|e| Xattr { namespace: e.namespace, name: e.name, value: vec![1; 3] })
                .collect();
            let raw = encode_shortform_xattrs(&attrs).unwrap();
            prop_assert_eq!(decode_shortform_xattrs(&raw).unwrap(), attrs);
        }

        #[test]
        fn index_round_trip(seq: u32, hash: u32, leaf in 0u64..=FS_BLOCK_MAX,
                            levels in 1u32..=BTREE_LEVELS_MAX,
                            fill in proptest::option::of(0u64..=FS_BLOCK_MAX)) {
            let record = XattrIndexRecord { hash, seq, leaf: FsBlock(leaf) };
            prop_assert_eq!(XattrIndexRecord::decode(&record.to_bytes()).unwrap(), record);
            let key = record.key();
            prop_assert_eq!(XattrIndexKey::decode(&key.to_bytes()).unwrap(), key);
            let root = XattrIndexRoot { root: FsBlock(leaf), levels, fill: fill.map(FsBlock) };
            prop_assert_eq!(XattrIndexRoot::decode(&root.to_bytes()).unwrap(), root);
        }

        #[test]
        fn xattr_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_shortform_xattrs(&raw);
            let _ = XattrLeaf::decode_block(&raw);
            let _ = XattrLeafHeader::decode(&raw);
            let _ = XattrIndexRecord::decode(&raw);
            let _ = XattrIndexKey::decode(&raw);
            let _ = XattrIndexRoot::decode(&raw);
        }
    }
}
