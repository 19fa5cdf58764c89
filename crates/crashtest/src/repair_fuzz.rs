//! The repair sweep: one metadata unit of the base image (`repair_base.rs`) is damaged at a
//! time (a bit flipped, the block zeroed, garbage, or one field changed with the CRC
//! recomputed, field by field as xfs_db's `fuzz` verb does: zero, ones, +1, -1, random, each
//! bit), then `fsck.cairn -y` runs. Each case must meet fsck's promise: `-y` exits 0 or 1;
//! `-n` afterwards is clean; a second `-y` changes nothing; the repaired image mounts and
//! its walk finds every inode, entry, content, target and attribute of the reference except
//! what the damaged unit held (`Held`); and a file can be created and the image still checks
//! clean after an unmount.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use cairn_blockdev::{BlockDevice, FileDevice, OpenOptions};
use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::dir::dir_data_entries;
use cairn_format::header::{HEADER_SIZE, MetaHeader, stamp};
use cairn_format::log::{LOG_RECORD_MAGIC, log_header_crc};
use cairn_format::ondisk::{get_u32, put_u32};
use cairn_format::xattr::{Namespace, XattrLeaf};
use cairn_format::{Extent, MetaKind, OnDisk};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use cairn_fsck::repair::{Mode, RepairOptions, repair_path};
use cairn_fsck::{Progress, check_path};

use crate::fields::{Field, MetaKindKey, UnitKind, Verb, fields_of, recompute_crc};
use crate::image::{self, SECTOR_BYTES, TEST_UUID};
use crate::panic_message;
use crate::repair_base::{Base, Snapshot, walk_snapshot};
use crate::walk::Seen;
use crate::workload::Rng;

/// A case still running after this long counts as a hang (a watchdog, not a speed check).
const HANG_LIMIT: Duration = Duration::from_secs(300);
/// File block of a directory's fork where its hash index is mapped (docs/fs.md).
const INDEX_FILE_BASE: u64 = 1 << 32;

/// One damageable unit of the base image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub offset: usize,
    pub len: usize,
    pub kind: UnitKind,
    /// What the unit is ("AGF of AG 1", "inode 131 (frag)", ...).
    pub label: String,
}

/// How a unit is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    BitFlip(usize),
    /// The whole filesystem block holding the unit zeroed.
    Zero,
    /// The unit overwritten with random bytes from this seed.
    Garbage(u64),
    /// One field changed, the CRC recomputed (unless the field is the CRC).
    Field {
        field: Field,
        verb: Verb,
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::BitFlip(bit) => write!(f, "bit {bit} flipped"),
            Damage::Zero => write!(f, "block zeroed"),
            Damage::Garbage(seed) => write!(f, "garbage ({seed})"),
            Damage::Field { field, verb } => write!(f, "{} {verb}", field.name),
        }
    }
}

/// One case: a unit and its damage.
#[derive(Debug, Clone)]
pub struct Case {
    pub unit: usize,
    pub damage: Damage,
    /// Printed on stderr before the case runs, when set.
    pub trace: Option<String>,
}

impl Case {
    fn new(unit: usize, damage: Damage) -> Self {
        Case {
            unit,
            damage,
            trace: None,
        }
    }

    fn field(unit: usize, field: &Field, verb: Verb) -> Self {
        let field = field.clone();
        Case::new(unit, Damage::Field { field, verb })
    }
}

/// What a repaired image lost against the reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Losses {
    pub inodes: u64,
    pub names: u64,
    pub contents: u64,
    /// Attributes lost or changed.
    pub xattrs: u64,
}

impl Losses {
    fn add(&mut self, other: Losses) {
        self.inodes += other.inodes;
        self.names += other.names;
        self.contents += other.contents;
        self.xattrs += other.xattrs;
    }
}

/// How one case ended.
#[derive(Debug, Clone, Default)]
pub struct CaseReport {
    /// The exit code of the first `-y` (0: the damage was not seen or harmless).
    pub exit: u8,
    /// Repairs the first `-y` made.
    pub actions: usize,
    pub losses: Losses,
    /// Broken promises; empty when the case passed.
    pub failures: Vec<String>,
    /// The damage changed no byte (a field set to the value it had).
    pub no_change: bool,
}

/// What the damaged unit held: what a repair may lose.
#[derive(Debug, Clone, Default)]
pub struct Held {
    pub inodes: BTreeSet<u64>,
    /// (directory, name) entries held.
    pub names: BTreeSet<(u64, String)>,
    /// (inode, full name) of the attributes held: a damaged attribute leaf's.
    pub xattrs: BTreeSet<(u64, Vec<u8>)>,
    /// File byte ranges held, per inode.
    pub ranges: BTreeMap<u64, Vec<(u64, u64)>>,
}

/// Every metadata unit of `bytes` in blocks of `block_bytes`: blocks whose header names a
/// metadata kind and the test UUID (inode blocks split into inodes), and log record headers.
pub fn all_units(base: &Base) -> Vec<Unit> {
    let g = base.geometry;
    let block_bytes = g.block_size as usize;
    let mut units = Vec::new();
    for (index, block) in base.bytes.chunks(block_bytes).enumerate() {
        let offset = index * block_bytes;
        if get_u32(block, 0) == LOG_RECORD_MAGIC {
            units.push(Unit {
                offset,
                len: cairn_format::log::LOG_RECORD_HEADER_BYTES,
                kind: UnitKind::LogRecord,
                label: format!("log record at block {index}"),
            });
            continue;
        }
        let Some(kind) = meta_kind(block) else {
            continue;
        };
        if kind == MetaKind::Inode {
            let inode_bytes = g.inode_size as usize;
            for (slot, raw) in block.chunks(inode_bytes).enumerate() {
                if let Some(header) = header_of(raw) {
                    units.push(Unit {
                        offset: offset + slot * inode_bytes,
                        len: inode_bytes,
                        kind: UnitKind::Meta(MetaKindKey::of(MetaKind::Inode)),
                        label: format!("inode {}", header.blkno),
                    });
                }
            }
            continue;
        }
        units.push(Unit {
            offset,
            len: block_bytes,
            kind: UnitKind::Meta(MetaKindKey::of(kind)),
            label: format!("{} at block {index}", kind.name()),
        });
    }
    units
}

fn header_of(bytes: &[u8]) -> Option<MetaHeader> {
    let header = MetaHeader::decode(bytes.get(..HEADER_SIZE)?).ok()?;
    (header.uuid == TEST_UUID).then_some(header)
}

fn meta_kind(bytes: &[u8]) -> Option<MetaKind> {
    header_of(bytes).and_then(|h| MetaKind::from_magic(h.magic))
}

/// The units the sweep damages: for each kind, the units that play a distinct part (every
/// AG's headers, each tree's root and first and last leaf, the role inodes, the big
/// directory's first, middle and last data blocks, the attribute leaves holding ACLs, ...).
pub fn select_units(base: &Base) -> Vec<Unit> {
    let units = all_units(base);
    let mut chosen: Vec<Unit> = Vec::new();
    let mut by_kind: BTreeMap<UnitKind, Vec<&Unit>> = BTreeMap::new();
    for unit in &units {
        by_kind.entry(unit.kind).or_default().push(unit);
    }
    for (kind, list) in &by_kind {
        match kind {
            UnitKind::Meta(key) if key.kind() == MetaKind::Inode => {
                chosen.extend(role_inodes(base, list));
            }
            UnitKind::Meta(_) => chosen.extend(sample_blocks(base, list)),
            UnitKind::LogRecord => chosen.extend(sample_log(base, list)),
        }
    }
    chosen
}

/// The inodes of the base image's roles, and a free inode.
fn role_inodes(base: &Base, inodes: &[&Unit]) -> Vec<Unit> {
    let mut chosen = Vec::new();
    for (role, &number) in &base.roles {
        let label = format!("inode {number}");
        if let Some(unit) = inodes.iter().find(|u| u.label == label) {
            let mut unit = (*unit).clone();
            unit.label = format!("inode {number} ({role})");
            chosen.push(unit);
        }
    }
    let free = inodes.iter().find(|u| {
        let raw = &base.bytes[u.offset..u.offset + u.len];
        cairn_format::ondisk::get_u16(raw, 48) == 0
    });
    if let Some(unit) = free {
        let mut unit = (*unit).clone();
        unit.label.push_str(" (free)");
        chosen.push(unit);
    }
    chosen
}

/// Per owner: the first, middle and last block, and every tree block above the leaves (or
/// the highest, for AG trees), so roots and nodes are always among them.
fn sample_blocks(base: &Base, blocks: &[&Unit]) -> Vec<Unit> {
    let mut by_owner: BTreeMap<u64, Vec<&Unit>> = BTreeMap::new();
    for unit in blocks {
        if let Some(header) = header_of(&base.bytes[unit.offset..]) {
            by_owner.entry(header.owner).or_default().push(unit);
        }
    }
    let mut chosen = Vec::new();
    for list in by_owner.values() {
        let mut picks: Vec<usize> = vec![0, list.len() / 2, list.len() - 1];
        for (index, unit) in list.iter().enumerate() {
            let raw = &base.bytes[unit.offset..unit.offset + unit.len];
            if is_tree(unit.kind) && cairn_format::ondisk::get_u16(raw, 48) > 0 {
                picks.push(index);
            }
        }
        if let Some(first) = list.iter().position(|u| is_dir_block_zero(base, u)) {
            picks.push(first);
        }
        picks.extend(list.iter().position(|u| holds_acl(base, u)));
        picks.sort_unstable();
        picks.dedup();
        chosen.extend(picks.into_iter().take(6).map(|i| list[i].clone()));
    }
    chosen
}

fn is_tree(kind: UnitKind) -> bool {
    let UnitKind::Meta(key) = kind else {
        return false;
    };
    BtreeLayout::for_kind(key.kind(), 1024).is_some()
}

/// Whether `unit` is an attribute leaf holding a POSIX ACL.
fn holds_acl(base: &Base, unit: &Unit) -> bool {
    unit.kind == UnitKind::Meta(MetaKindKey::of(MetaKind::AttrBlock))
        && XattrLeaf::decode_block(&base.bytes[unit.offset..unit.offset + unit.len]).is_ok_and(
            |leaf| {
                leaf.entries
                    .iter()
                    .any(|e| e.namespace == Namespace::System)
            },
        )
}

/// Whether `unit` is a directory's data block 0 (the one holding the markers).
fn is_dir_block_zero(base: &Base, unit: &Unit) -> bool {
    unit.kind == UnitKind::Meta(MetaKindKey::of(MetaKind::DirData))
        && dir_data_entries(&base.bytes[unit.offset..unit.offset + unit.len])
            .is_ok_and(|e| e.iter().any(|e| e.name == b"..parent"))
}

/// The newest log record (the clean unmount record), the oldest and one in the middle.
fn sample_log(base: &Base, records: &[&Unit]) -> Vec<Unit> {
    let lsn = |u: &&Unit| cairn_format::ondisk::get_u64(&base.bytes[u.offset..], 16);
    let mut sorted: Vec<&Unit> = records.to_vec();
    sorted.sort_by_key(lsn);
    let mut picks = vec![0, sorted.len() / 2, sorted.len().saturating_sub(1)];
    picks.dedup();
    picks
        .into_iter()
        .filter_map(|i| sorted.get(i).map(|u| (*u).clone()))
        .collect()
}

/// The cases of a sweep over `units`: each unit gets bit flips, a zeroed block, garbage, and
/// each field every verb (`full`), or (not `full`) one bit flip, the zeroed block, garbage,
/// and the value verbs on every `stride`-th field (the fields rotating with the unit).
pub fn cases(base: &Base, units: &[Unit], full: bool, stride: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rng = Rng(0x5eed);
    for (index, unit) in units.iter().enumerate() {
        let flips = if full { 4 } else { 1 };
        for _ in 0..flips {
            let bit = rng.below(unit.len as u64 * 8) as usize;
            cases.push(Case::new(index, Damage::BitFlip(bit)));
        }
        cases.push(Case::new(index, Damage::Zero));
        cases.push(Case::new(index, Damage::Garbage(rng.next_u64())));
        let raw = &base.bytes[unit.offset..unit.offset + unit.len];
        for (field_index, field) in fields_of(unit.kind, raw).into_iter().enumerate() {
            if (field_index + index) % stride.max(1) != 0 {
                continue;
            }
            let verbs = if full {
                field.all_verbs(rng.next_u64())
            } else {
                vec![
                    Verb::Zero,
                    Verb::Ones,
                    Verb::Plus1,
                    Verb::Minus1,
                    Verb::Random(rng.next_u64()),
                ]
            };
            for verb in verbs {
                cases.push(Case::field(index, &field, verb));
            }
        }
    }
    cases
}

/// The fast sample `cargo test` runs: two cases per unit, one whole-unit damage (a bit
/// flipped, the block zeroed or garbage, in turn from unit to unit) and one field changed
/// with the CRC recomputed (fields and verbs rotating from unit to unit), so every kind
/// sees every kind of damage.
pub fn fast_cases(base: &Base, units: &[Unit]) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rng = Rng(0xfa57);
    let verbs = [Verb::Zero, Verb::Ones, Verb::Plus1, Verb::Minus1];
    for (index, unit) in units.iter().enumerate() {
        let whole = match index % 3 {
            0 => Damage::BitFlip(rng.below(unit.len as u64 * 8) as usize),
            1 => Damage::Zero,
            _ => Damage::Garbage(rng.next_u64()),
        };
        cases.push(Case::new(index, whole));
        let raw = &base.bytes[unit.offset..unit.offset + unit.len];
        let fields = fields_of(unit.kind, raw);
        let Some(field) = fields.get((index * 7) % fields.len().max(1)) else {
            continue;
        };
        let verb = match index % 5 {
            4 => Verb::Random(rng.next_u64()),
            n => verbs[n],
        };
        cases.push(Case::field(index, field, verb));
    }
    cases
}

/// A damage as what it writes over the base image: `bytes` at byte `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub offset: usize,
    pub bytes: Vec<u8>,
}

impl Patch {
    /// The unit's bytes as the patch leaves them (the patch covers the unit).
    fn unit<'a>(&'a self, unit: &Unit) -> &'a [u8] {
        let from = unit.offset - self.offset;
        &self.bytes[from..from + unit.len]
    }
}

/// `damage` applied to `unit` of the base image, as a patch over the block (or inode, or log
/// record header) holding it, or `None` if no byte changed.
pub fn damaged(base: &Base, unit: &Unit, damage: &Damage) -> Option<Patch> {
    let block_bytes = base.geometry.block_size as usize;
    let (offset, len) = match damage {
        Damage::Zero => (unit.offset / block_bytes * block_bytes, block_bytes),
        _ => (unit.offset, unit.len),
    };
    let mut bytes = base.bytes[offset..offset + len].to_vec();
    let raw = &mut bytes[unit.offset - offset..unit.offset - offset + unit.len];
    match damage {
        Damage::BitFlip(bit) => raw[bit / 8] ^= 1 << (bit % 8),
        Damage::Zero => raw.fill(0),
        Damage::Garbage(seed) => {
            let mut rng = Rng(*seed);
            for byte in raw.iter_mut() {
                *byte = rng.next_u64() as u8;
            }
        }
        Damage::Field { field, verb } => {
            let old = field.get(raw)?;
            field.set(raw, field.apply(*verb, old));
            if recompute_crc(unit.kind, field) {
                restamp(unit.kind, raw);
            }
        }
    }
    // A zeroed block is zeroed whole, not only the unit in it.
    if *damage == Damage::Zero {
        bytes.fill(0);
    }
    (bytes != base.bytes[offset..offset + len]).then_some(Patch { offset, bytes })
}

/// Recomputes the CRC of `raw`, a unit of `kind` (a log record's header CRC).
fn restamp(kind: UnitKind, raw: &mut [u8]) {
    match kind {
        UnitKind::Meta(_) => stamp(raw, None),
        UnitKind::LogRecord => {
            let crc = log_header_crc(raw);
            put_u32(raw, 4, crc);
        }
    }
}

/// What `unit` held in the base image (`damage` zeroing an inode's block holds every inode
/// of that block), and for an extent tree leaf also what its records map after the damage
/// (`damaged`, the unit's bytes after the damage): a record moved to a hole shows its data
/// there, which no check can tell from the truth.
pub fn held(base: &Base, unit: &Unit, damage: &Damage, damaged: &[u8]) -> Held {
    let mut held = Held::default();
    let UnitKind::Meta(key) = unit.kind else {
        return held;
    };
    let raw = &base.bytes[unit.offset..unit.offset + unit.len];
    let Some(header) = header_of(raw) else {
        return held;
    };
    match key.kind() {
        MetaKind::Inode => {
            held.inodes.insert(header.blkno);
            if *damage == Damage::Zero {
                let block_bytes = base.geometry.block_size as usize;
                let start = unit.offset / block_bytes * block_bytes;
                for inode in base.bytes[start..start + block_bytes].chunks(unit.len) {
                    if let Some(h) = header_of(inode) {
                        held.inodes.insert(h.blkno);
                    }
                }
            }
        }
        MetaKind::DirData => hold_dir_block(raw, header.owner, &mut held),
        MetaKind::BmapBtree => {
            hold_bmap_subtree(base, header.blkno, header.owner, &mut held);
            for extent in leaf_extents(damaged) {
                hold_extent(base, header.owner, &extent, &mut held);
            }
        }
        // An attribute index tree is derived from the leaves: it holds nothing.
        MetaKind::AttrBlock => hold_attr_leaf(raw, header.owner, &mut held),
        MetaKind::SymlinkBlock => {
            held.inodes.insert(header.owner);
        }
        _ => {}
    }
    held
}

fn hold_attr_leaf(raw: &[u8], inode: u64, held: &mut Held) {
    if let Ok(leaf) = XattrLeaf::decode_block(raw) {
        for entry in &leaf.entries {
            let name = full_xattr_name(entry.namespace, &entry.name);
            held.xattrs.insert((inode, name));
        }
    }
}

/// An attribute's name as listed: its namespace's prefix, a dot, its stored name.
fn full_xattr_name(namespace: Namespace, name: &[u8]) -> Vec<u8> {
    let prefix: &[u8] = match namespace {
        Namespace::User => b"user.",
        Namespace::Trusted => b"trusted.",
        Namespace::Security => b"security.",
        Namespace::System => b"system.",
    };
    [prefix, name].concat()
}

fn hold_dir_block(raw: &[u8], dir: u64, held: &mut Held) {
    for entry in dir_data_entries(raw).unwrap_or_default() {
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        held.names.insert((dir, name));
    }
}

/// Holds what the extent tree block at `at` of inode `owner` leads to: its extents' file
/// ranges, and for a directory the entries of the data blocks they map.
fn hold_bmap_subtree(base: &Base, at: u64, owner: u64, held: &mut Held) {
    let block_bytes = base.geometry.block_size as usize;
    let Some(layout) = BtreeLayout::for_kind(MetaKind::BmapBtree, block_bytes as u32) else {
        return;
    };
    let mut pending = vec![at];
    while let Some(block) = pending.pop() {
        let start = block as usize * block_bytes;
        let Some(raw) = base.bytes.get(start..start + block_bytes) else {
            continue;
        };
        let Ok(header) = BtreeHeader::decode(raw) else {
            continue;
        };
        for slot in 0..usize::from(header.record_count) {
            if header.level > 0 {
                pending.extend(layout.pointer(raw, slot));
                continue;
            }
            let Some(extent) = layout
                .record(raw, slot)
                .and_then(|r| Extent::decode(r).ok())
            else {
                continue;
            };
            hold_extent(base, owner, &extent, held);
        }
    }
}

/// The extents a leaf block of an extent tree holds (none if it is not a leaf).
fn leaf_extents(raw: &[u8]) -> Vec<Extent> {
    let Some(layout) = BtreeLayout::for_kind(MetaKind::BmapBtree, raw.len() as u32) else {
        return Vec::new();
    };
    match BtreeHeader::decode(raw) {
        Ok(header) if header.level == 0 => (0..usize::from(header.record_count))
            .filter_map(|slot| layout.record(raw, slot))
            .filter_map(|record| Extent::decode(record).ok())
            .collect(),
        _ => Vec::new(),
    }
}

fn hold_extent(base: &Base, owner: u64, extent: &Extent, held: &mut Held) {
    let block_bytes = u64::from(base.geometry.block_size);
    // A damaged record may name any block: its byte range saturates.
    let range = (
        extent.file_block.saturating_mul(block_bytes),
        extent.file_end().saturating_mul(block_bytes),
    );
    held.ranges.entry(owner).or_default().push(range);
    if extent.file_block >= INDEX_FILE_BASE {
        return;
    }
    for index in 0..u64::from(extent.length) {
        let start = (extent.fs_block.0 + index) as usize * block_bytes as usize;
        if let Some(raw) = base.bytes.get(start..start + block_bytes as usize)
            && meta_kind(raw) == Some(MetaKind::DirData)
        {
            hold_dir_block(raw, owner, held);
        }
    }
}

/// Compares the repaired image's walk with the reference: returns what was lost and the
/// losses that the damaged unit did not hold.
pub fn compare(base: &Base, held: &Held, after: &Snapshot) -> (Losses, Vec<String>) {
    let mut losses = Losses::default();
    let mut failures = Vec::new();
    for (&inode, seen) in &base.reference.inodes {
        let is_held = held.inodes.contains(&inode);
        let Some(now) = after.inodes.get(&inode).filter(|n| n.kind == seen.kind) else {
            losses.inodes += 1;
            if !is_held {
                failures.push(format!("inode {inode} ({:?}) is gone", seen.kind));
            }
            continue;
        };
        let (lost, unheld) = xattr_losses(held, inode, seen, now);
        losses.xattrs += lost;
        if !is_held && let Some(what) = unheld {
            failures.push(format!("inode {inode}: {what}"));
        }
        if seen.kind == FileKind::Directory {
            // A directory's size follows its entries, which are compared below.
            continue;
        }
        let ranges = held.ranges.get(&inode).map_or(&[][..], Vec::as_slice);
        let same = now.target == seen.target
            && now.size == seen.size
            && same_outside(&seen.content, &now.content, ranges)
            && (ranges.is_empty() || now.content.len() == seen.content.len());
        if !same {
            losses.contents += 1;
            if !is_held {
                failures.push(format!("inode {inode}: contents, size or target differ"));
            }
        }
    }
    for (dir, name, inode) in &base.reference.names {
        if after.names.contains(&(*dir, name.clone(), *inode)) {
            continue;
        }
        losses.names += 1;
        let is_held = held.inodes.contains(dir)
            || held.inodes.contains(inode)
            || held.names.contains(&(*dir, name.clone()));
        if !is_held {
            failures.push(format!(
                "entry '{name}' of directory {dir} (inode {inode}) is gone"
            ));
        }
    }
    (losses, failures)
}

/// The attributes of inode `inode` that the repaired image (`now`) lost or changed against
/// the reference (`seen`), and the first such change the damaged unit did not hold (an
/// attribute that was not there before is allowed only where the damaged unit held some
/// of the inode's attributes: a damaged name).
fn xattr_losses(held: &Held, inode: u64, seen: &Seen, now: &Seen) -> (u64, Option<String>) {
    let holds = |name: &Vec<u8>| held.xattrs.contains(&(inode, name.clone()));
    let mut lost = 0;
    let mut unheld = None;
    for (name, value) in &seen.xattrs {
        if now.xattrs.get(name) == Some(value) {
            continue;
        }
        lost += 1;
        if !holds(name) && unheld.is_none() {
            let shown = String::from_utf8_lossy(name);
            unheld = Some(format!("attribute {shown} lost or changed"));
        }
    }
    let any_held = held
        .xattrs
        .range((inode, Vec::new())..)
        .next()
        .is_some_and(|h| h.0 == inode);
    if let Some(name) = now
        .xattrs
        .keys()
        .find(|name| !seen.xattrs.contains_key(*name))
        && !any_held
        && unheld.is_none()
    {
        unheld = Some(format!(
            "attribute {} appeared",
            String::from_utf8_lossy(name)
        ));
    }
    (lost, unheld)
}

/// Whether `a` and `b` are equal outside `ranges` (byte ranges).
fn same_outside(a: &[u8], b: &[u8], ranges: &[(u64, u64)]) -> bool {
    let mut ranges = ranges.to_vec();
    ranges.sort_unstable();
    let length = a.len().max(b.len());
    let mut cursor = 0;
    for (start, end) in ranges.into_iter().chain([(length as u64, length as u64)]) {
        let start = (start as usize).min(length);
        if start > cursor && a.get(cursor..start) != b.get(cursor..start) {
            return false;
        }
        cursor = cursor.max((end as usize).min(length));
    }
    true
}

/// Runs fsck in `mode` (`None`: check only) on the image file at `path`: the exit code and
/// the number of repairs, or the panic's message.
fn fsck(path: &Path, mode: Option<Mode>) -> Result<(u8, usize, Vec<String>), String> {
    let progress = Progress::hidden();
    let ran = catch_unwind(AssertUnwindSafe(|| match mode {
        None => check_path(path, true, &progress).map(|report| {
            let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
            (u8::from(!problems.is_empty()) * 4, 0, problems)
        }),
        Some(mode) => {
            let options = RepairOptions {
                mode,
                discard_log: false,
            };
            repair_path(path, true, options, &progress).map(|outcome| {
                let mut left: Vec<String> = outcome
                    .after
                    .problems
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                left.extend(outcome.skipped.iter().cloned());
                (outcome.exit_code(), outcome.actions.len(), left)
            })
        }
    }));
    match ran {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(error)) => Ok((8, 0, vec![error.to_string()])),
        Err(panic) => Err(format!("panic: {}", panic_message(panic.as_ref()))),
    }
}

/// Runs one case in a thread watched for hangs, with its image file in `scratch`.
pub fn run_case(base: &Arc<Base>, unit: &Unit, damage: &Damage, scratch: &Path) -> CaseReport {
    let Some(patch) = damaged(base, unit, damage) else {
        return CaseReport {
            no_change: true,
            ..CaseReport::default()
        };
    };
    let held = held(base, unit, damage, patch.unit(unit));
    let (send, receive) = mpsc::channel();
    let base = Arc::clone(base);
    let path = scratch.join("image");
    let spawned = std::thread::Builder::new()
        .name("repair-case".into())
        .spawn(move || {
            let mut report = catch_unwind(AssertUnwindSafe(|| {
                repair_case(&base, &patch, &held, &path)
            }))
            .unwrap_or_else(|panic| CaseReport {
                failures: vec![format!("panic: {}", panic_message(panic.as_ref()))],
                ..CaseReport::default()
            });
            shorten(&mut report.failures);
            // The receiver is gone only after a hang was reported; nothing to do then.
            let _ = send.send(report);
        });
    if let Err(error) = spawned {
        return CaseReport {
            failures: vec![format!("cannot start the case thread: {error}")],
            ..CaseReport::default()
        };
    }
    receive
        .recv_timeout(HANG_LIMIT)
        .unwrap_or_else(|_| CaseReport {
            failures: vec!["hang: the case did not finish".into()],
            ..CaseReport::default()
        })
}

/// Writes the base image with `patch` over it to the file at `path` (a worker reuses its
/// file: its pages are overwritten, not allocated again).
fn write_image(base: &Base, patch: &Patch, path: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.write_all_at(&base.bytes, 0)?;
    file.write_all_at(&patch.bytes, patch.offset as u64)?;
    file.set_len(base.bytes.len() as u64)
}

/// The CRC32C of the file at `path` (read a piece at a time).
fn image_crc(path: &Path) -> std::io::Result<u32> {
    let mut file = std::fs::File::open(path)?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut crc = 0;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buffer[..read]);
    }
}

/// Repairs the base image with `patch` through the image file at `path` and judges the
/// result.
fn repair_case(base: &Base, patch: &Patch, held: &Held, path: &Path) -> CaseReport {
    let mut report = CaseReport::default();
    let fail = |report: &mut CaseReport, what: String| report.failures.push(what);
    if let Err(error) = write_image(base, patch, path) {
        fail(&mut report, format!("cannot write the image: {error}"));
        return report;
    }
    // To look at a case by hand: its damaged image is kept where this names.
    if let Some(keep) = std::env::var_os("CAIRN_SWEEP_KEEP") {
        let _ = std::fs::copy(path, keep);
    }
    match fsck(path, Some(Mode::Yes)) {
        Ok((exit, actions, left)) => {
            report.exit = exit;
            report.actions = actions;
            if exit > 1 {
                fail(&mut report, format!("-y exited {exit}: {}", summary(&left)));
                return report;
            }
        }
        Err(panic) => {
            fail(&mut report, format!("-y: {panic}"));
            return report;
        }
    }
    match fsck(path, None) {
        Ok((0, _, _)) => {}
        Ok((exit, _, left)) => fail(
            &mut report,
            format!("-n after -y exited {exit}: {}", summary(&left)),
        ),
        Err(panic) => fail(&mut report, format!("-n: {panic}")),
    }
    let repaired = image_crc(path);
    match fsck(path, Some(Mode::Yes)) {
        Ok((0, _, _)) => {}
        Ok((exit, _, left)) => {
            fail(
                &mut report,
                format!("second -y exited {exit}: {}", summary(&left)),
            );
        }
        Err(panic) => fail(&mut report, format!("second -y: {panic}")),
    }
    match (repaired, image_crc(path)) {
        (Ok(before), Ok(after)) if before == after => {}
        (Ok(_), Ok(_)) => fail(&mut report, "the second -y changed the image".into()),
        (Err(error), _) | (_, Err(error)) => {
            fail(&mut report, format!("cannot read the image: {error}"));
        }
    }
    if !report.failures.is_empty() {
        return report;
    }
    match inspect_repaired(path) {
        Ok(after) => {
            let (losses, failures) = compare(base, held, &after);
            report.losses = losses;
            report.failures.extend(failures);
        }
        Err(error) => fail(&mut report, error),
    }
    report
}

/// Keeps the first few failures of a case and counts the rest.
fn shorten(failures: &mut Vec<String>) {
    const SHOWN: usize = 4;
    if failures.len() > SHOWN {
        let more = failures.len() - SHOWN;
        failures.truncate(SHOWN);
        failures.push(format!("... and {more} more"));
    }
}

fn summary(lines: &[String]) -> String {
    let mut text = lines.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if lines.len() > 3 {
        text.push_str(&format!("; ... ({} in all)", lines.len()));
    }
    text
}

/// Mounts the repaired image file at `path` and walks it, then creates and writes a file,
/// unmounts and checks it; returns what the walk saw.
fn inspect_repaired(path: &Path) -> Result<Snapshot, String> {
    let options = OpenOptions::new().buffered().sector_size(SECTOR_BYTES);
    let device = FileDevice::open(path, &options).map_err(|e| format!("open: {e}"))?;
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    let fs = Filesystem::mount(device.clone(), MountOptions::default())
        .map_err(|e| format!("mount after repair: {e}"))?;
    let after = walk_snapshot(&fs).map_err(|e| format!("the repaired image: {e}"))?;
    let who = Credentials::root();
    // Damage may leave the root immutable or append-only, which is a valid state repair
    // cannot tell from a choice: clear them first, as an administrator would (chattr -ia).
    let root = fs.root();
    let mut attributes = fs
        .file_attributes(root)
        .map_err(|e| format!("the root's attributes: {e}"))?
        .attributes;
    if attributes.flags.immutable || attributes.flags.append_only {
        attributes.flags.immutable = false;
        attributes.flags.append_only = false;
        fs.set_file_attributes(root, &attributes, &who, true)
            .map_err(|e| format!("chattr -ia of the root: {e}"))?;
    }
    let made = fs
        .create(
            fs.root(),
            b"after-repair",
            FileKind::Regular,
            0o644,
            0,
            &who,
        )
        .and_then(|attr| fs.write(attr.inode, 0, &[5u8; 3000]).map(|_| attr.inode));
    if let Err(error) = made {
        return Err(format!("create after repair: {error}"));
    }
    fs.unmount()
        .map_err(|e| format!("unmount after repair: {e}"))?;
    image::fsck(device.as_ref())
        .map_err(|e| format!("after a create on the repaired image: {e}"))?;
    Ok(after)
}

/// Counts of a sweep, per unit kind.
#[derive(Debug, Clone, Default)]
pub struct KindTally {
    pub cases: u64,
    /// `-y` found nothing (the damage was harmless or not visible).
    pub untouched: u64,
    pub repaired: u64,
    pub failed: u64,
    pub losses: Losses,
}

/// Counts and failures of a sweep.
#[derive(Debug, Default)]
pub struct SweepTally {
    pub kinds: BTreeMap<&'static str, KindTally>,
    /// (unit, damage, failures) of each failed case.
    pub failures: Vec<(String, String, Vec<String>)>,
}

impl SweepTally {
    pub fn cases(&self) -> u64 {
        self.kinds.values().map(|k| k.cases).sum()
    }

    fn record(&mut self, unit: &Unit, damage: &Damage, report: CaseReport) {
        if report.no_change {
            return;
        }
        let kind = self.kinds.entry(unit.kind.name()).or_default();
        kind.cases += 1;
        kind.losses.add(report.losses);
        if !report.failures.is_empty() {
            kind.failed += 1;
            self.failures
                .push((unit.label.clone(), damage.to_string(), report.failures));
        } else if report.exit == 0 {
            kind.untouched += 1;
        } else {
            kind.repaired += 1;
        }
    }

    /// The table of counts, one line per kind.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<34} {:>7} {:>9} {:>9} {:>7}  lost: {:>6} {:>6} {:>8} {:>6}\n",
            "unit kind",
            "cases",
            "repaired",
            "untouched",
            "failed",
            "inodes",
            "names",
            "contents",
            "xattrs"
        );
        for (name, kind) in &self.kinds {
            out.push_str(&format!(
                "{name:<34} {:>7} {:>9} {:>9} {:>7}        {:>6} {:>6} {:>8} {:>6}\n",
                kind.cases,
                kind.repaired,
                kind.untouched,
                kind.failed,
                kind.losses.inodes,
                kind.losses.names,
                kind.losses.contents,
                kind.losses.xattrs
            ));
        }
        out
    }
}

/// A directory for one worker's image files: in `/dev/shm` where it exists (fsck's flushes
/// cost nothing there), else the temporary directory.
pub fn scratch_dir(worker: usize) -> std::io::Result<PathBuf> {
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = root.join(format!("cairn-repair-{}-{worker}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs `cases` over `units` on `workers` threads; `progress` is called after each case with
/// the number done and, if the case failed, what failed.
pub fn sweep(
    base: &Arc<Base>,
    units: &[Unit],
    cases: &[Case],
    workers: usize,
    progress: &(dyn Fn(usize, Option<String>) + Sync),
) -> std::io::Result<SweepTally> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let tally = std::sync::Mutex::new(SweepTally::default());
    std::thread::scope(|scope| -> std::io::Result<()> {
        let mut handles = Vec::new();
        for worker in 0..workers.max(1) {
            let scratch = scratch_dir(worker)?;
            let (next, tally) = (&next, &tally);
            handles.push(scope.spawn(move || {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(case) = cases.get(index) else { break };
                    let unit = &units[case.unit];
                    if let Some(trace) = &case.trace {
                        eprintln!("{trace}, {}", case.damage);
                    }
                    let report = run_case(base, unit, &case.damage, &scratch);
                    let failed = (!report.failures.is_empty()).then(|| {
                        let failures = report.failures.join("; ");
                        format!("{}, {}: {failures}", unit.label, case.damage)
                    });
                    if let Ok(mut tally) = tally.lock() {
                        tally.record(unit, &case.damage, report);
                    }
                    progress(index + 1, failed);
                }
                let _ = std::fs::remove_dir_all(&scratch);
            }));
        }
        for handle in handles {
            let _ = handle.join();
        }
        Ok(())
    })?;
    tally
        .into_inner()
        .map_err(|_| std::io::Error::other("a sweep worker panicked"))
}
