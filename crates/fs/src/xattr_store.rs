//! Extended attribute storage in an inode's attr fork: short form (Local) while every value is
//! held inline and the set fits beside the data fork, else one attribute leaf block (`CXA1`,
//! mapped by a one-extent Extents attr fork at attr block 0) whose large values live in
//! remote blocks written straight to the device.
//!
//! The attr fork sits at the end of the literal area and takes just the bytes it needs,
//! rounded to 8; the data fork keeps the rest, never less than `DATA_FORK_MIN_BYTES`. Moving
//! the boundary copies the data fork's contents (re-laying out an extent tree root).
//!
//! A change runs in three steps, all under the inode's metadata lock: `plan` decides the new
//! layout and refuses (`NoSpace`) before anything is changed; `store` allocates the leaf and
//! the new remote values, writes the values, then rewrites the fork and the leaf and logs an
//! extent-free intent for the blocks no longer referenced; after the commit, `free_unused`
//! frees them in a second transaction with the done item (mount finishes the intent after a
//! crash in between, like the data path's unmaps).
//!
//! Crash argument: a remote value is written to newly allocated blocks before the
//! transaction that links it commits, and the journal flushes the device before it writes
//! any commit record, so a linked value is always on stable storage.

use cairn_alloc::Request;
use cairn_blockdev::AlignedBuf;
use cairn_btree::Buffers;
use cairn_bufcache::{HeaderOps, ReadSpec};
use cairn_format::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME};
use cairn_format::dir::name_hash;
use cairn_format::inode::{
    BmapRoot, ForkFormat, INODE_CORE_SIZE, fork_extents, literal_bytes, put_fork_extents,
};
use cairn_format::xattr::{
    Namespace, Xattr, XattrLeaf, XattrLeafEntry, XattrValue, decode_shortform_xattrs,
    encode_shortform_xattrs,
};
use cairn_format::{AgNumber, Extent, FsBlock, MetaHeader, MetaKind};
use cairn_journal::{FreeExtent, IntentId};

use crate::FsError;
use crate::bmap::step_reservation;
use crate::bmap_tree::home_target;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;

static ATTR_LEAF_OPS: HeaderOps = HeaderOps::new(MetaKind::AttrBlock);

/// Bytes of the literal area the data fork always keeps once an attr fork exists (room for
/// four inline extents or a small extent tree root).
pub(crate) const DATA_FORK_MIN_BYTES: usize = 64;
/// Bytes of an attr fork that maps the leaf block: one extent.
const LEAF_FORK_BYTES: usize = 16;
/// New remote values one change may write: with the leaf and the blocks freed by the intent
/// this stays within `EXTENTS_PER_STEP` allocations of the step reservation.
const REMOTE_ALLOCATIONS_MAX: usize = 2;
/// Remote value and leaf extents one freeing step of a removed inode unlinks.
const FREE_STEP_EXTENTS: usize = 4;

/// An inode's attributes as loaded for one operation.
#[derive(Debug, Default)]
pub(crate) struct AttrSet {
    pub entries: Vec<XattrLeafEntry>,
    /// The leaf block, when the set is stored in one.
    pub leaf: Option<FsBlock>,
    /// Remote value extents no longer referenced; `store` hands them to an intent.
    pub unused: Vec<(FsBlock, u32)>,
}

impl AttrSet {
    /// Index of the attribute `(namespace, name)`.
    pub fn find(&self, namespace: Namespace, name: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.namespace == namespace && e.name == name)
    }

    /// Removes entry `index`, remembering its remote blocks for freeing.
    pub fn remove(&mut self, index: usize, block_size: u32) {
        let entry = self.entries.remove(index);
        if let XattrValue::Remote { block, length } = entry.value {
            self.unused
                .push((block, length.div_ceil(block_size).max(1)));
        }
    }
}

/// The layout a change stores, decided before anything is changed.
#[derive(Debug)]
pub(crate) enum Layout {
    /// No attributes: the attr fork goes away.
    Empty,
    /// The encoded short form.
    Short(Vec<u8>),
    /// A leaf block; the listed local entries move to remote blocks.
    Leaf { to_remote: Vec<usize> },
}

fn spec(fs: &Filesystem, number: u64) -> ReadSpec {
    ReadSpec::new(&ATTR_LEAF_OPS, fs.uuid).with_owner(number)
}

const fn round8(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8
}

/// Blocks a remote value of `length` bytes fills.
pub(crate) fn remote_blocks(fs: &Filesystem, length: u32) -> u32 {
    length.div_ceil(fs.geometry.block_size).max(1)
}

/// Values longer than this go to remote blocks in leaf form. At least the literal area, so
/// a short-form value never has to move when the set changes to a leaf.
fn remote_threshold(fs: &Filesystem, inode_size: u32) -> usize {
    (fs.geometry.block_size as usize / 8).max(literal_bytes(inode_size))
}

/// Loads the attributes of inode `number` through `ctx` (a transaction or a cache context).
pub(crate) fn load<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    data: &InodeData,
) -> Result<AttrSet, FsError> {
    let Some(range) = data.core.attr_fork_range(data.raw.len() as u32) else {
        return Ok(AttrSet::default());
    };
    let corrupt = |detail: String| FsError::corrupt("inode attr fork", number, detail);
    let fork = &data.raw[range];
    match data.core.attr_format {
        Some(ForkFormat::Local) => {
            let attrs = decode_shortform_xattrs(fork).map_err(|e| corrupt(e.to_string()))?;
            let entries = attrs
                .into_iter()
                .map(|a| XattrLeafEntry {
                    namespace: a.namespace,
                    name: a.name,
                    value: XattrValue::Local(a.value),
                })
                .collect();
            Ok(AttrSet {
                entries,
                ..AttrSet::default()
            })
        }
        Some(ForkFormat::Extents) => {
            let leaf = leaf_block(fs, number, fork, data.core.attr_extent_count)?;
            let guard = ctx.buffer(leaf, &spec(fs, number), false)?;
            let decoded = XattrLeaf::decode_block(guard)
                .map_err(|e| FsError::corrupt("xattr block", leaf.0, e.to_string()))?;
            Ok(AttrSet {
                entries: decoded.entries,
                leaf: Some(leaf),
                unused: Vec::new(),
            })
        }
        _ => Err(corrupt("unsupported attr fork format".into())),
    }
}

/// The leaf block an Extents attr fork maps: exactly one block at attr block 0.
fn leaf_block(fs: &Filesystem, number: u64, fork: &[u8], count: u16) -> Result<FsBlock, FsError> {
    let extents = fork_extents(fork, u32::from(count))
        .map_err(|e| FsError::corrupt("inode attr fork", number, e.to_string()))?;
    match extents.as_slice() {
        [extent] if extent.file_block == 0 && extent.length == 1 && !extent.unwritten => {
            if extent.fs_block.0 >= fs.geometry.block_count {
                return Err(FsError::corrupt(
                    "inode attr fork",
                    number,
                    "leaf past the device",
                ));
            }
            Ok(extent.fs_block)
        }
        _ => Err(FsError::corrupt(
            "inode attr fork",
            number,
            "not one leaf block extent",
        )),
    }
}

/// Reads a remote value.
pub(crate) fn read_remote(
    fs: &Filesystem,
    block: FsBlock,
    length: u32,
) -> Result<Vec<u8>, FsError> {
    let blocks = remote_blocks(fs, length);
    if block.0.saturating_add(u64::from(blocks)) > fs.geometry.block_count {
        return Err(FsError::corrupt(
            "xattr remote value",
            block.0,
            "past the device",
        ));
    }
    let mut buf = AlignedBuf::zeroed(blocks as usize * fs.geometry.block_size as usize);
    fs.device
        .read_at(fs.geometry.byte_offset(block), &mut buf)?;
    Ok(buf[..length as usize].to_vec())
}

/// Bytes the data fork must keep: its contents, and at least `DATA_FORK_MIN_BYTES`.
fn data_fork_needed(number: u64, data: &InodeData) -> Result<usize, FsError> {
    let used = match data.core.data_format {
        ForkFormat::Local => data.core.size as usize,
        ForkFormat::Extents => 16 * data.core.data_extent_count as usize,
        ForkFormat::Btree => {
            let root = BmapRoot::decode(data.data_fork())
                .map_err(|e| FsError::corrupt("inode data fork", number, e.to_string()))?;
            BmapRoot::HEADER_BYTES + 16 * root.keys.len()
        }
        ForkFormat::Device => 0,
    };
    Ok(round8(used).max(DATA_FORK_MIN_BYTES))
}

/// The short form of `entries`, if all values are local and the encoding is valid.
fn shortform(entries: &[XattrLeafEntry]) -> Option<Vec<u8>> {
    let mut attrs = Vec::with_capacity(entries.len());
    for entry in entries {
        let XattrValue::Local(value) = &entry.value else {
            return None;
        };
        attrs.push(Xattr {
            namespace: entry.namespace,
            name: entry.name.clone(),
            value: value.clone(),
        });
    }
    encode_shortform_xattrs(&attrs).ok()
}

/// Decides how `set` will be stored, refusing with `NoSpace` before anything changes.
pub(crate) fn plan(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
    set: &AttrSet,
) -> Result<Layout, FsError> {
    if set.entries.is_empty() {
        return Ok(Layout::Empty);
    }
    let inode_size = data.raw.len() as u32;
    let room = literal_bytes(inode_size).saturating_sub(data_fork_needed(number, data)?);
    if let Some(short) = shortform(&set.entries)
        && round8(short.len()) <= room
    {
        return Ok(Layout::Short(short));
    }
    if room < LEAF_FORK_BYTES {
        return Err(FsError::NoSpace);
    }
    let threshold = remote_threshold(fs, inode_size);
    let to_remote: Vec<usize> = (0..set.entries.len())
        .filter(|&i| matches!(&set.entries[i].value, XattrValue::Local(v) if v.len() > threshold))
        .collect();
    if to_remote.len() > REMOTE_ALLOCATIONS_MAX {
        return Err(FsError::NoSpace);
    }
    let mut sized = set.entries.clone();
    for &index in &to_remote {
        sized[index].value = XattrValue::Remote {
            block: FsBlock(0),
            length: 1,
        };
    }
    let leaf = XattrLeaf {
        header: MetaHeader::new(MetaKind::AttrBlock, 0, fs.uuid, number),
        entries: sized,
    };
    if leaf.used_bytes() > fs.geometry.block_size as usize {
        return Err(FsError::NoSpace);
    }
    Ok(Layout::Leaf { to_remote })
}

/// Allocates `length` contiguous blocks near the inode, at or above AG `floor`.
fn allocate(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    length: u32,
    floor: &mut u32,
) -> Result<FsBlock, FsError> {
    let mut request = Request::near(home_target(fs, number), length, length);
    request.lowest_ag = AgNumber(*floor);
    let found = fs
        .alloc
        .allocate(tx, &JournalLog(&fs.journal), &request)?
        .ok_or(FsError::NoSpace)?;
    *floor = (*floor).max(found.ag.0);
    Ok(found.fs_start)
}

/// Allocates the leaf (if new) and the remote values `to_remote`, writing the values;
/// records every allocation in `allocated`. Returns whether the leaf is new.
fn allocate_all(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    set: &mut AttrSet,
    to_remote: &[usize],
    allocated: &mut Vec<(FsBlock, u32)>,
) -> Result<bool, FsError> {
    let mut floor = 0;
    let new_leaf = set.leaf.is_none();
    if new_leaf {
        let leaf = allocate(fs, tx, number, 1, &mut floor)?;
        allocated.push((leaf, 1));
        set.leaf = Some(leaf);
    }
    for &index in to_remote {
        let XattrValue::Local(value) = &set.entries[index].value else {
            continue;
        };
        let length = value.len() as u32;
        let blocks = remote_blocks(fs, length);
        let start = allocate(fs, tx, number, blocks, &mut floor)?;
        allocated.push((start, blocks));
        let mut buf = AlignedBuf::zeroed(blocks as usize * fs.geometry.block_size as usize);
        buf[..value.len()].copy_from_slice(value);
        fs.device.write_at(fs.geometry.byte_offset(start), &buf)?;
        set.entries[index].value = XattrValue::Remote {
            block: start,
            length,
        };
    }
    Ok(new_leaf)
}

/// The encoded leaf block of `set` at `leaf`.
fn encode_leaf(
    fs: &Filesystem,
    number: u64,
    set: &mut AttrSet,
    leaf: FsBlock,
) -> Result<Vec<u8>, FsError> {
    set.entries.sort_by(|a, b| {
        (name_hash(&a.name), a.namespace, &a.name).cmp(&(name_hash(&b.name), b.namespace, &b.name))
    });
    let block = XattrLeaf {
        header: MetaHeader::new(MetaKind::AttrBlock, leaf.0, fs.uuid, number),
        entries: set.entries.clone(),
    };
    let mut bytes = vec![0u8; fs.geometry.block_size as usize];
    block
        .encode_block(&mut bytes)
        .map_err(|e| FsError::corrupt("xattr block", leaf.0, e.to_string()))?;
    Ok(bytes)
}

/// The new literal area for a data fork of `data_bytes` bytes followed by `attr` (format and
/// fork bytes), or the whole literal area for the data fork when `attr` is `None`.
fn literal_image(
    number: u64,
    data: &InodeData,
    attr: Option<(usize, &[u8])>,
) -> Result<Vec<u8>, FsError> {
    let literal = literal_bytes(data.raw.len() as u32);
    let attr_bytes = attr.map_or(0, |(bytes, _)| bytes);
    let data_bytes = literal - attr_bytes;
    let mut image = vec![0u8; literal];
    let fork = data.data_fork();
    if data.core.data_format == ForkFormat::Btree {
        let corrupt = |e: cairn_format::FormatError| {
            FsError::corrupt("inode data fork", number, e.to_string())
        };
        let root = BmapRoot::decode(fork).map_err(corrupt)?;
        root.encode(&mut image[..data_bytes]).map_err(corrupt)?;
    } else {
        let used = data_fork_needed(number, data)?.min(fork.len());
        if used > data_bytes {
            return Err(FsError::NoSpace);
        }
        image[..used].copy_from_slice(&fork[..used]);
    }
    if let Some((_, bytes)) = attr {
        image[data_bytes..data_bytes + bytes.len()].copy_from_slice(bytes);
    }
    Ok(image)
}

/// Installs a literal area built by `literal_image` with the attr fork in `format`.
fn install(data: &mut InodeData, image: &[u8], attr: Option<(ForkFormat, usize)>) {
    data.raw[INODE_CORE_SIZE..].copy_from_slice(image);
    let core = &mut data.core;
    match attr {
        None => {
            core.attr_format = None;
            core.attr_offset = 0;
            core.attr_extent_count = 0;
        }
        Some((format, attr_bytes)) => {
            core.attr_format = Some(format);
            core.attr_offset = ((image.len() - attr_bytes) / 8) as u16;
            core.attr_extent_count = u16::from(format == ForkFormat::Extents);
        }
    }
}

/// What `store` installs once every fallible step has succeeded.
struct Prepared {
    image: Vec<u8>,
    attr: Option<(ForkFormat, usize)>,
}

/// Blocks that a committed change no longer references, with the intent naming them.
#[derive(Debug)]
pub(crate) struct Unused {
    intent: IntentId,
    extents: Vec<(FsBlock, u32)>,
}

/// Stores `set` as `layout` (from `plan`) in `tx`: allocations and value writes first, then
/// the leaf buffer, then the inode's forks. On an error the inode is unchanged and the blocks
/// allocated here are freed again in `tx`, which the caller still commits. Returns the
/// intent for the blocks no longer referenced (`free_unused` frees them after the commit).
pub(crate) fn store(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    mut set: AttrSet,
    layout: Layout,
) -> Result<Option<Unused>, FsError> {
    let mut allocated = Vec::new();
    let prepared = prepare(fs, tx, number, data, &mut set, &layout, &mut allocated);
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            let sequence = free_sequence(&fs.journal);
            for &(start, length) in &allocated {
                let log = JournalLog(&fs.journal);
                fs.alloc.free(tx, &log, start, length, sequence)?;
            }
            return Err(error);
        }
    };
    install(data, &prepared.image, prepared.attr);
    let gained: u64 = allocated.iter().map(|&(_, l)| u64::from(l)).sum();
    let released: u64 = set.unused.iter().map(|&(_, l)| u64::from(l)).sum();
    data.core.block_count = (data.core.block_count + gained).saturating_sub(released);
    if set.unused.is_empty() {
        return Ok(None);
    }
    let freed: Vec<FreeExtent> = set
        .unused
        .iter()
        .map(|&(start, length)| FreeExtent { start, length })
        .collect();
    let intent = tx.tx.log_free_intent(&freed);
    Ok(Some(Unused {
        intent,
        extents: set.unused,
    }))
}

/// Every fallible step of `store`: allocations, value writes, the leaf buffer (written or
/// invalidated) and the new literal area.
fn prepare(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &InodeData,
    set: &mut AttrSet,
    layout: &Layout,
    allocated: &mut Vec<(FsBlock, u32)>,
) -> Result<Prepared, FsError> {
    let to_remote = match layout {
        Layout::Leaf { to_remote } => to_remote,
        Layout::Empty | Layout::Short(_) => {
            if let Some(leaf) = set.leaf.take() {
                tx.invalidate(leaf, &spec(fs, number))?;
                set.unused.push((leaf, 1));
            }
            return Ok(match layout {
                Layout::Short(bytes) => {
                    let attr_bytes = round8(bytes.len());
                    Prepared {
                        image: literal_image(number, data, Some((attr_bytes, bytes)))?,
                        attr: Some((ForkFormat::Local, attr_bytes)),
                    }
                }
                _ => Prepared {
                    image: literal_image(number, data, None)?,
                    attr: None,
                },
            });
        }
    };
    let new_leaf = allocate_all(fs, tx, number, set, to_remote, allocated)?;
    let leaf = set
        .leaf
        .ok_or_else(|| FsError::corrupt("inode attr fork", number, "leaf not allocated"))?;
    let bytes = encode_leaf(fs, number, set, leaf)?;
    let extent = Extent::new(0, leaf, 1, false)
        .map_err(|e| FsError::corrupt("xattr block", leaf.0, e.to_string()))?;
    let mut fork = [0u8; LEAF_FORK_BYTES];
    put_fork_extents(&[extent], &mut fork)?;
    let image = literal_image(number, data, Some((LEAF_FORK_BYTES, &fork)))?;
    let spec = spec(fs, number);
    let guard = tx.buffer(leaf, &spec, new_leaf)?;
    guard.write(0, &bytes)?;
    Ok(Prepared {
        image,
        attr: Some((ForkFormat::Extents, LEAF_FORK_BYTES)),
    })
}

/// The second half of a change that unreferenced blocks: frees them and logs the done item.
pub(crate) fn free_unused(fs: &Filesystem, unused: Unused) -> Result<(), FsError> {
    let mut tx = fs.begin(step_reservation(fs))?;
    let sequence = free_sequence(&fs.journal);
    let mut sorted = unused.extents;
    sorted.sort_by_key(|&(start, _)| start.0);
    for (start, length) in sorted {
        let log = JournalLog(&fs.journal);
        fs.alloc.free(&mut tx, &log, start, length, sequence)?;
    }
    tx.tx.log_free_done(unused.intent);
    tx.tx.commit()?;
    fs.blocks_freed();
    Ok(())
}

/// Frees every attribute of an unlinked inode (held locked by the caller), a few remote
/// values per step, each step a change like `removexattr`'s.
pub(crate) fn free_all(fs: &Filesystem, number: u64, data: &mut InodeData) -> Result<(), FsError> {
    while data.core.attr_format.is_some() {
        let mut tx = fs.begin(step_reservation(fs))?;
        let planned = load(fs, &mut tx, number, data).and_then(|mut set| {
            let remote: Vec<usize> = (0..set.entries.len())
                .filter(|&i| matches!(set.entries[i].value, XattrValue::Remote { .. }))
                .collect();
            // The leaf goes with the last step: at most `FREE_STEP_EXTENTS` extents a step.
            let doomed: Vec<usize> = match remote.len() < FREE_STEP_EXTENTS {
                true => (0..set.entries.len()).collect(),
                false => remote[..FREE_STEP_EXTENTS].to_vec(),
            };
            for &index in doomed.iter().rev() {
                set.remove(index, fs.geometry.block_size);
            }
            let layout = plan(fs, number, data, &set)?;
            Ok((set, layout))
        });
        let (set, layout) = match planned {
            Ok(planned) => planned,
            Err(error) => {
                tx.tx.cancel()?;
                return Err(error);
            }
        };
        let stored = store(fs, &mut tx, number, data, set, layout);
        Filesystem::log_inode(&mut tx, number, data);
        Filesystem::commit(tx, &mut [data])?;
        if let Some(unused) = stored? {
            free_unused(fs, unused)?;
        }
    }
    Ok(())
}

/// Stores the POSIX ACLs a new inode inherits (see `Filesystem::inherited`) in its empty
/// attr fork, inside the create transaction `tx`.
pub(crate) fn store_new(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    inherited: &crate::namei::Inherited,
) -> Result<(), FsError> {
    let encode = |acl: &cairn_format::acl::Acl| {
        acl.encode()
            .map_err(|e| FsError::corrupt("POSIX ACL", number, e.to_string()))
    };
    let mut set = AttrSet::default();
    let lists = [
        (ACL_ACCESS_NAME, inherited.access.as_ref()),
        (ACL_DEFAULT_NAME, inherited.default.as_deref()),
    ];
    for (name, acl) in lists {
        if let Some(acl) = acl {
            set.entries.push(XattrLeafEntry {
                namespace: Namespace::System,
                name: name.to_vec(),
                value: XattrValue::Local(encode(acl)?),
            });
        }
    }
    if set.entries.is_empty() {
        return Ok(());
    }
    let layout = plan(fs, number, data, &set)?;
    let unused = store(fs, tx, number, data, set, layout)?;
    debug_assert!(unused.is_none(), "a new inode had attribute blocks");
    Ok(())
}

/// Frees, inside `tx`, every block of the attr fork of an inode being freed again in the
/// transaction that made it (a create that failed after `store_new`), and drops the fork.
pub(crate) fn release_new(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    if data.core.attr_format.is_none() {
        return Ok(());
    }
    let mut set = load(fs, tx, number, data)?;
    let mut blocks = Vec::new();
    if let Some(leaf) = set.leaf.take() {
        // Freed metadata: no image of it may reach its home.
        tx.invalidate(leaf, &spec(fs, number))?;
        blocks.push((leaf, 1));
    }
    for entry in &set.entries {
        if let XattrValue::Remote { block, length } = entry.value {
            blocks.push((block, remote_blocks(fs, length)));
        }
    }
    let sequence = free_sequence(&fs.journal);
    blocks.sort_by_key(|&(start, _)| start.0);
    for &(start, length) in &blocks {
        let log = JournalLog(&fs.journal);
        fs.alloc.free(tx, &log, start, length, sequence)?;
        data.core.block_count = data.core.block_count.saturating_sub(u64::from(length));
    }
    let image = literal_image(number, data, None)?;
    install(data, &image, None);
    Ok(())
}
