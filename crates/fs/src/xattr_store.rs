//! Extended attribute storage in an inode's attr fork, in one of three forms:
//! - short form (Local) while every value is held inline and the set fits beside the data
//!   fork;
//! - leaf form: one attribute leaf block (`CXA1`, mapped by a one-extent Extents attr fork
//!   at attr block 0);
//! - index form (Btree attr fork) once one leaf no longer holds the set: many leaves and an
//!   index tree (`xattr_index.rs`), so each operation costs the same at 10 or 10,000
//!   attributes.
//!
//! In leaf and index form, values longer than `remote_threshold` live in remote blocks
//! written straight to the device.
//!
//! The attr fork sits at the end of the literal area and takes just the bytes it needs,
//! rounded to 8; the data fork keeps the rest, never less than `DATA_FORK_MIN_BYTES`. Moving
//! the boundary copies the data fork's contents (re-laying out an extent tree root).
//!
//! A change (`apply`, one `Edit`) runs under the inode's metadata lock in one transaction.
//! In short and leaf form the whole set is loaded and edited: `plan` decides the new layout
//! and refuses (`NoSpace`) before anything is changed; `store` allocates the leaf and the new
//! remote values (or builds the index form), writes the values, then rewrites the fork and
//! the leaf. In index form the edit goes to one leaf and the tree. Either way, blocks no
//! longer referenced are named in extent-free intents in the transaction, and after the
//! commit `free_unused` frees them, one transaction per intent (mount finishes an intent
//! after a crash in between, like the data path's unmaps). A change that fails gives back
//! what it allocated inside its transaction and leaves the inode as it was.
//!
//! Crash argument: a remote value is written to newly allocated blocks before the
//! transaction that links it commits (a transaction that orders data, as all do by default),
//! and the journal flushes the device before that checkpoint's commit record, so a linked
//! value is always on stable storage.

use cairn_blockdev::AlignedBuf;
use cairn_btree::Buffers;
use cairn_format::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME};
use cairn_format::inode::{
    BmapRoot, ForkFormat, INODE_CORE_SIZE, fork_extents, literal_bytes, put_fork_extents,
};
use cairn_format::xattr::{
    Namespace, Xattr, XattrIndexRoot, XattrLeafEntry, XattrValue, decode_shortform_xattrs,
    encode_shortform_xattrs,
};
use cairn_format::{Extent, FsBlock, OnDisk};
use cairn_journal::{FreeExtent, IntentId, Reservation};

use crate::FsError;
use crate::bmap::{EXTENTS_PER_STEP, step_reservation};
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;
use crate::types::XattrFlags;
use crate::xattr_index::{self, AttrCtx, leaf_spec};

/// Bytes of the literal area the data fork always keeps once an attr fork exists (room for
/// four inline extents or a small extent tree root).
pub(crate) const DATA_FORK_MIN_BYTES: usize = 64;
/// Bytes of an attr fork that maps the leaf block (one extent) or holds the index root.
const LEAF_FORK_BYTES: usize = 16;
/// New remote values one change may write.
const REMOTE_ALLOCATIONS_MAX: usize = 2;
/// Attributes one freeing step of a removed inode's index form removes (each step is one
/// change's reservation).
const FREE_STEP_ATTRS: usize = 1;
/// Remote value and leaf extents one freeing step of a removed inode's leaf form unlinks.
const FREE_STEP_EXTENTS: usize = 4;

/// One change to an inode's attributes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Edit<'a> {
    /// Sets `key` to `value`; `flags` may require it to be new or to exist.
    Put {
        key: (Namespace, &'a [u8]),
        value: &'a [u8],
        flags: XattrFlags,
    },
    /// Removes `key`: `NoData` when it is missing and `required`; `flags` are checked as for
    /// a put (an ACL equivalent to a mode is set by removing it).
    Remove {
        key: (Namespace, &'a [u8]),
        flags: XattrFlags,
        required: bool,
    },
}

impl Edit<'_> {
    fn key(&self) -> (Namespace, &[u8]) {
        match self {
            Edit::Put { key, .. } | Edit::Remove { key, .. } => *key,
        }
    }

    /// Refuses the edit when its flags disagree with whether its attribute `exists`.
    fn check(&self, exists: bool) -> Result<(), FsError> {
        let flags = match self {
            Edit::Put { flags, .. } | Edit::Remove { flags, .. } => *flags,
        };
        match (exists, flags, self) {
            (true, XattrFlags::Create, _) => Err(FsError::Exists),
            (false, XattrFlags::Replace, _) => Err(FsError::NoData),
            (false, _, Edit::Remove { required: true, .. }) => Err(FsError::NoData),
            _ => Ok(()),
        }
    }
}

/// An inode's attributes in short or leaf form, as loaded for one operation.
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

    /// Applies `edit`.
    fn edit(&mut self, edit: &Edit<'_>, block_size: u32) -> Result<(), FsError> {
        let (namespace, name) = edit.key();
        let found = self.find(namespace, name);
        edit.check(found.is_some())?;
        if let Some(index) = found {
            self.remove(index, block_size);
        }
        if let Edit::Put { value, .. } = edit {
            self.entries.push(XattrLeafEntry {
                namespace,
                name: name.to_vec(),
                value: XattrValue::Local(value.to_vec()),
            });
        }
        Ok(())
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
    /// More than a leaf holds: the index form, built from the set.
    Index { to_remote: Vec<usize> },
}

const fn round8(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8
}

/// Blocks a remote value of `length` bytes fills.
pub(crate) fn remote_blocks(fs: &Filesystem, length: u32) -> u32 {
    length.div_ceil(fs.geometry.block_size).max(1)
}

/// Values longer than this go to remote blocks in leaf and index form. At least the literal
/// area, so a short-form value never has to move when the set changes to a leaf.
fn remote_threshold(fs: &Filesystem, data: &InodeData) -> usize {
    (fs.geometry.block_size as usize / 8).max(literal_bytes(data.raw.len() as u32))
}

/// The reservation of one attribute change of inode `number` (held locked). Short and leaf
/// form: a step's (a leaf, remote values, their allocations; building the index form
/// allocates no more: a new leaf, the tree root and a remote value). Index form, with a tree
/// of `levels` that an insert may grow by one: allocations for every split, a new leaf and a
/// remote value (`levels + 3`, each `2 + 2 * (free_levels + 1)` buffers), the insert's and
/// the delete's paths with a sibling each (`4 * (levels + 1)`), two leaves, the inode, and an
/// intent for every `EXTENTS_PER_STEP` blocks it may unreference (old value, leaf, merged
/// and returned tree blocks: `2 * levels + 4`).
pub(crate) fn change_reservation(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
) -> Result<Reservation, FsError> {
    let Some(root) = index_root(number, data)? else {
        return Ok(step_reservation(fs));
    };
    let levels = root.levels + 1;
    let per_extent = 2 + 2 * (crate::bmap::free_tree_levels(fs) + 1);
    let buffers = (levels + 3) * per_extent + 4 * (levels + 1) + 2;
    let intents = (2 * levels + 4).div_ceil(EXTENTS_PER_STEP as u32) + 1;
    let block = fs.geometry.block_size;
    Ok(Reservation::for_items(
        &fs.geometry,
        buffers,
        block,
        1,
        intents,
    ))
}

/// The index root of an inode in index form.
fn index_root(number: u64, data: &InodeData) -> Result<Option<XattrIndexRoot>, FsError> {
    if data.core.attr_format != Some(ForkFormat::Btree) {
        return Ok(None);
    }
    let range = data
        .core
        .attr_fork_range(data.raw.len() as u32)
        .ok_or_else(|| FsError::corrupt("inode attr fork", number, "no attr fork"))?;
    XattrIndexRoot::decode(&data.raw[range])
        .map(Some)
        .map_err(|e| FsError::corrupt("inode attr fork", number, e.to_string()))
}

/// Loads the short or leaf form attributes of inode `number` through `ctx` (a transaction
/// or a cache context).
fn load<'c, X: Buffers<'c>>(
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
            let decoded = xattr_index::read_leaf(fs, ctx, number, leaf)?;
            Ok(AttrSet {
                entries: decoded.entries,
                leaf: Some(leaf),
                unused: Vec::new(),
            })
        }
        _ => Err(corrupt("unsupported attr fork format".into())),
    }
}

/// Every attribute of inode `number` (names for a list; remote values not read).
pub(crate) fn entries<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    data: &InodeData,
) -> Result<Vec<XattrLeafEntry>, FsError> {
    match index_root(number, data)? {
        Some(root) => xattr_index::entries(fs, ctx, number, &root),
        None => Ok(load(fs, ctx, number, data)?.entries),
    }
}

/// The value of attribute `key` of inode `number`, if it has it (remote values read).
pub(crate) fn get<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    data: &InodeData,
    key: (Namespace, &[u8]),
) -> Result<Option<Vec<u8>>, FsError> {
    let value = match index_root(number, data)? {
        Some(root) => xattr_index::get(fs, ctx, number, &root, key)?,
        None => {
            let set = load(fs, ctx, number, data)?;
            set.find(key.0, key.1)
                .map(|index| set.entries[index].value.clone())
        }
    };
    match value {
        None => Ok(None),
        Some(XattrValue::Local(value)) => Ok(Some(value)),
        Some(XattrValue::Remote { block, length }) => read_remote(fs, block, length).map(Some),
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
    let threshold = remote_threshold(fs, data);
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
    Ok(match xattr_index::fits(fs, sized) {
        true => Layout::Leaf { to_remote },
        false => Layout::Index { to_remote },
    })
}

/// Writes `value` to `blocks` new blocks this change allocates; returns the first.
fn write_remote(ctx: &mut AttrCtx<'_, '_>, value: &[u8]) -> Result<XattrValue, FsError> {
    let blocks = remote_blocks(ctx.fs, value.len() as u32);
    let start = ctx.allocate(blocks, false)?;
    let block_size = ctx.fs.geometry.block_size as usize;
    let mut buf = AlignedBuf::zeroed(blocks as usize * block_size);
    buf[..value.len()].copy_from_slice(value);
    ctx.fs
        .device
        .write_at(ctx.fs.geometry.byte_offset(start), &buf)?;
    Ok(XattrValue::Remote {
        block: start,
        length: value.len() as u32,
    })
}

/// Moves the local values `to_remote` of `set` to new remote blocks.
fn place_remote(
    ctx: &mut AttrCtx<'_, '_>,
    set: &mut AttrSet,
    to_remote: &[usize],
) -> Result<(), FsError> {
    for &index in to_remote {
        if let XattrValue::Local(value) = &set.entries[index].value {
            let placed = write_remote(ctx, &value.clone())?;
            set.entries[index].value = placed;
        }
    }
    Ok(())
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

/// The literal area and fork of an index form rooted at `root`.
fn index_image(number: u64, data: &InodeData, root: &XattrIndexRoot) -> Result<Prepared, FsError> {
    let bytes = root.to_bytes();
    Ok(Prepared {
        image: literal_image(number, data, Some((LEAF_FORK_BYTES, &bytes)))?,
        attr: Some((ForkFormat::Btree, LEAF_FORK_BYTES)),
    })
}

/// Blocks that a committed change no longer references, with the intents naming them (at
/// most `EXTENTS_PER_STEP` extents each, so each is freed in one step transaction).
#[derive(Debug)]
pub(crate) struct Unused {
    intents: Vec<(IntentId, Vec<(FsBlock, u32)>)>,
}

/// Logs intents in `tx` for `extents`; `None` when there are none.
fn log_unused(tx: &mut Tx<'_>, extents: Vec<(FsBlock, u32)>) -> Option<Unused> {
    if extents.is_empty() {
        return None;
    }
    let intents = extents
        .chunks(EXTENTS_PER_STEP)
        .map(|chunk| {
            let freed: Vec<FreeExtent> = chunk
                .iter()
                .map(|&(start, length)| FreeExtent { start, length })
                .collect();
            (tx.tx.log_free_intent(&freed), chunk.to_vec())
        })
        .collect();
    Some(Unused { intents })
}

/// Gives back, inside the transaction, what a failed change allocated (its metadata
/// buffers invalidated first, so no image of them reaches their home).
fn give_back(ctx: &mut AttrCtx<'_, '_>) -> Result<(), FsError> {
    let sequence = free_sequence(&ctx.fs.journal);
    let allocated = std::mem::take(&mut ctx.allocated);
    for (start, length, metadata) in allocated {
        if metadata {
            ctx.tx.invalidate(start, &leaf_spec(ctx.fs, ctx.number))?;
        }
        let log = JournalLog(&ctx.fs.journal);
        ctx.fs.alloc.free(ctx.tx, &log, start, length, sequence)?;
    }
    Ok(())
}

/// Applies `edit` to the attributes of inode `number` (held locked) in `tx`. On an error
/// the inode is unchanged and what the change allocated is given back in `tx`, which the
/// caller still commits. Returns the intents for the blocks no longer referenced
/// (`free_unused` frees them after the commit).
pub(crate) fn apply(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    edit: &Edit<'_>,
) -> Result<Option<Unused>, FsError> {
    if let Some(root) = index_root(number, data)? {
        return apply_index(fs, tx, number, data, root, edit);
    }
    let mut set = load(fs, tx, number, data)?;
    set.edit(edit, fs.geometry.block_size)?;
    let layout = plan(fs, number, data, &set)?;
    store(fs, tx, number, data, set, layout)
}

/// `apply` in index form: the edit goes to one leaf and the tree.
fn apply_index(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    mut root: XattrIndexRoot,
    edit: &Edit<'_>,
) -> Result<Option<Unused>, FsError> {
    let threshold = remote_threshold(fs, data);
    let mut ctx = AttrCtx::new(tx, fs, number);
    let changed = (|| {
        let tree = xattr_index::open(fs, number, &root)?;
        let found = xattr_index::find(fs, &mut ctx, number, &tree, edit.key())?;
        edit.check(found.is_some())?;
        match (edit, found) {
            (Edit::Put { key, value, .. }, found) => {
                let placed = match value.len() > threshold {
                    true => write_remote(&mut ctx, value)?,
                    false => XattrValue::Local(value.to_vec()),
                };
                let entry = XattrLeafEntry {
                    namespace: key.0,
                    name: key.1.to_vec(),
                    value: placed,
                };
                xattr_index::put(&mut ctx, &mut root, entry, found)?;
                index_image(number, data, &root).map(Some)
            }
            (Edit::Remove { key, .. }, Some(found)) => {
                match xattr_index::remove(&mut ctx, &root, found, *key)? {
                    Some(root) => index_image(number, data, &root).map(Some),
                    None => Ok(Some(Prepared {
                        image: literal_image(number, data, None)?,
                        attr: None,
                    })),
                }
            }
            (Edit::Remove { .. }, None) => Ok(None),
        }
    })();
    let prepared = match changed {
        Ok(Some(prepared)) => prepared,
        Ok(None) => return Ok(None),
        Err(error) => {
            give_back(&mut ctx)?;
            return Err(error);
        }
    };
    install(data, &prepared.image, prepared.attr);
    finish(ctx, data, Vec::new())
}

/// Accounts a change's allocations and unreferenced blocks in the inode's block count and
/// logs intents for the unreferenced ones.
fn finish(
    ctx: AttrCtx<'_, '_>,
    data: &mut InodeData,
    mut unused: Vec<(FsBlock, u32)>,
) -> Result<Option<Unused>, FsError> {
    unused.extend(ctx.unused);
    let gained: u64 = ctx.allocated.iter().map(|&(_, l, _)| u64::from(l)).sum();
    let released: u64 = unused.iter().map(|&(_, l)| u64::from(l)).sum();
    data.core.block_count = (data.core.block_count + gained).saturating_sub(released);
    Ok(log_unused(ctx.tx, unused))
}

/// Stores `set` as `layout` (from `plan`) in `tx`: allocations and value writes first, then
/// the leaf buffer (or the index form), then the inode's forks. On an error the inode is
/// unchanged and the blocks allocated here are freed again in `tx`, which the caller still
/// commits. Returns the intents for the blocks no longer referenced.
pub(crate) fn store(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    mut set: AttrSet,
    layout: Layout,
) -> Result<Option<Unused>, FsError> {
    let mut ctx = AttrCtx::new(tx, fs, number);
    let prepared = match prepare(&mut ctx, data, &mut set, layout) {
        Ok(prepared) => prepared,
        Err(error) => {
            give_back(&mut ctx)?;
            return Err(error);
        }
    };
    install(data, &prepared.image, prepared.attr);
    finish(ctx, data, set.unused)
}

/// Every fallible step of `store`: allocations, value writes, the leaf buffer (written or
/// invalidated) or the index form, and the new literal area.
fn prepare(
    ctx: &mut AttrCtx<'_, '_>,
    data: &InodeData,
    set: &mut AttrSet,
    layout: Layout,
) -> Result<Prepared, FsError> {
    let number = ctx.number;
    let to_remote = match layout {
        Layout::Leaf { to_remote } => to_remote,
        Layout::Index { to_remote } => {
            place_remote(ctx, set, &to_remote)?;
            let entries = std::mem::take(&mut set.entries);
            let root = xattr_index::build(ctx, entries, set.leaf)?;
            return index_image(number, data, &root);
        }
        Layout::Empty | Layout::Short(_) => {
            if let Some(leaf) = set.leaf.take() {
                ctx.tx.invalidate(leaf, &leaf_spec(ctx.fs, number))?;
                set.unused.push((leaf, 1));
            }
            return Ok(match layout {
                Layout::Short(bytes) => {
                    let attr_bytes = round8(bytes.len());
                    Prepared {
                        image: literal_image(number, data, Some((attr_bytes, &bytes)))?,
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
    let new_leaf = set.leaf.is_none();
    let leaf = match set.leaf {
        Some(leaf) => leaf,
        None => ctx.allocate(1, true)?,
    };
    place_remote(ctx, set, &to_remote)?;
    let extent = Extent::new(0, leaf, 1, false)
        .map_err(|e| FsError::corrupt("xattr block", leaf.0, e.to_string()))?;
    let mut fork = [0u8; LEAF_FORK_BYTES];
    put_fork_extents(&[extent], &mut fork)?;
    let image = literal_image(number, data, Some((LEAF_FORK_BYTES, &fork)))?;
    ctx.write_leaf(leaf, set.entries.clone(), new_leaf)?;
    set.leaf = Some(leaf);
    Ok(Prepared {
        image,
        attr: Some((ForkFormat::Extents, LEAF_FORK_BYTES)),
    })
}

/// The second half of a change that unreferenced blocks: frees them, one transaction per
/// intent, each logging its done item.
pub(crate) fn free_unused(fs: &Filesystem, unused: Unused) -> Result<(), FsError> {
    for (intent, mut extents) in unused.intents {
        let mut tx = fs.begin_finishing(step_reservation(fs))?;
        let sequence = free_sequence(&fs.journal);
        extents.sort_by_key(|&(start, _)| start.0);
        for (start, length) in extents {
            let log = JournalLog(&fs.journal);
            fs.alloc.free(&mut tx, &log, start, length, sequence)?;
        }
        tx.tx.log_free_done(intent);
        tx.tx.commit()?;
    }
    fs.blocks_freed();
    Ok(())
}

/// Frees every attribute of an unlinked inode (held locked by the caller) in steps, each a
/// change like `removexattr`'s: a few attributes of the index form, or a few remote values
/// of the leaf form, per step.
pub(crate) fn free_all(fs: &Filesystem, number: u64, data: &mut InodeData) -> Result<(), FsError> {
    while data.core.attr_format.is_some() {
        let mut tx = fs.begin(change_reservation(fs, number, data)?)?;
        let stored = match index_root(number, data) {
            Ok(Some(root)) => free_index_step(fs, &mut tx, number, data, &root),
            Ok(None) => free_leaf_step(fs, &mut tx, number, data),
            Err(error) => Err(error),
        };
        Filesystem::log_inode(&mut tx, number, data);
        fs.commit(tx, &mut [data])?;
        if let Some(unused) = stored? {
            free_unused(fs, unused)?;
        }
    }
    Ok(())
}

/// One freeing step of the index form: `FREE_STEP_ATTRS` attributes go.
fn free_index_step(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
    root: &XattrIndexRoot,
) -> Result<Option<Unused>, FsError> {
    let mut ctx = AttrCtx::new(tx, fs, number);
    let prepared = match xattr_index::remove_some(&mut ctx, root, FREE_STEP_ATTRS)? {
        Some(root) => index_image(number, data, &root)?,
        None => Prepared {
            image: literal_image(number, data, None)?,
            attr: None,
        },
    };
    install(data, &prepared.image, prepared.attr);
    finish(ctx, data, Vec::new())
}

/// One freeing step of the short or leaf form: a few remote values go, and with the last
/// step the leaf.
fn free_leaf_step(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    number: u64,
    data: &mut InodeData,
) -> Result<Option<Unused>, FsError> {
    let mut set = load(fs, tx, number, data)?;
    let remote: Vec<usize> = (0..set.entries.len())
        .filter(|&i| matches!(set.entries[i].value, XattrValue::Remote { .. }))
        .collect();
    let doomed: Vec<usize> = match remote.len() < FREE_STEP_EXTENTS {
        true => (0..set.entries.len()).collect(),
        false => remote[..FREE_STEP_EXTENTS].to_vec(),
    };
    for &index in doomed.iter().rev() {
        set.remove(index, fs.geometry.block_size);
    }
    let layout = plan(fs, number, data, &set)?;
    store(fs, tx, number, data, set, layout)
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
        tx.invalidate(leaf, &leaf_spec(fs, number))?;
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
