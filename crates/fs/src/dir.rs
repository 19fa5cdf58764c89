//! Directories: short form inside the inode while the entries fit, then data blocks mapped
//! through the directory's extent list.
//!
//! Block form keeps the parent as the first entry of block 0 with file type `Unknown` (a
//! type no user entry has), so lookups and readdir skip it. Readdir cookies: 1 is ".", 2 is
//! "..", and an entry's cookie is its tag (short form) or data address (block form) plus 3,
//! so a cookie names a position that survives other entries coming and going.

use cairn_bufcache::{BufKey, HeaderOps, ReadSpec};
use cairn_format::dir::{
    DIR_DATA_HEADER_SIZE, DirDataEntry, ShortformDir, ShortformEntry, dir_address,
    dir_data_entries, dir_data_insert, dir_data_remove, init_dir_data_block,
};
use cairn_format::inode::{FileType, ForkFormat};
use cairn_format::{FsBlock, MetaHeader, MetaKind};

use crate::FsError;
use crate::bmap::{self, Mapping};
use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::InodeData;

static DIR_DATA_OPS: HeaderOps = HeaderOps::new(MetaKind::DirData);

/// The name of the parent marker entry in block form (its type `Unknown` is what marks it).
const PARENT_MARKER: &[u8] = b"..parent";
/// Cookie offset of stored entries: 0 = start, 1 = ".", 2 = "..".
const COOKIE_BASE: u64 = 3;

/// A found entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub inode: u64,
    pub file_type: FileType,
    pub cookie: u64,
    pub name: Vec<u8>,
}

fn shortform(data: &InodeData) -> Result<ShortformDir, FsError> {
    let raw = cairn_format::inode::local_bytes(data.data_fork(), data.core.size)?;
    ShortformDir::decode(raw)
        .map_err(|e| FsError::corrupt("directory", data.core.header.blkno, e.to_string()))
}

fn store_shortform(data: &mut InodeData, dir: &ShortformDir) -> Result<bool, FsError> {
    let bytes = dir.encode()?;
    if bytes.len() > data.data_fork().len() {
        return Ok(false);
    }
    data.reset_data_fork(ForkFormat::Local);
    data.data_fork_mut()[..bytes.len()].copy_from_slice(&bytes);
    data.core.size = bytes.len() as u64;
    Ok(true)
}

/// Initialises an empty short-form directory with parent `parent`.
pub(crate) fn init(data: &mut InodeData, parent: u64) -> Result<(), FsError> {
    let dir = ShortformDir {
        parent,
        entries: Vec::new(),
    };
    match store_shortform(data, &dir)? {
        true => Ok(()),
        false => Err(FsError::corrupt(
            "directory",
            data.core.header.blkno,
            "inode too small",
        )),
    }
}

fn spec(fs: &Filesystem, dir: u64) -> ReadSpec {
    ReadSpec::new(&DIR_DATA_OPS, fs.uuid).with_owner(dir)
}

fn block_count(fs: &Filesystem, data: &InodeData) -> u32 {
    (data.core.size / u64::from(fs.geometry.block_size)) as u32
}

fn block_of(data: &InodeData, index: u32) -> Result<FsBlock, FsError> {
    let list = bmap::extents(data)?;
    match bmap::map(&list, u64::from(index)) {
        Mapping::Mapped(extent) => Ok(FsBlock(
            extent.fs_block.0 + (u64::from(index) - extent.file_block),
        )),
        Mapping::Hole { .. } => Err(FsError::corrupt(
            "directory",
            data.core.header.blkno,
            format!("hole at data block {index}"),
        )),
    }
}

/// The entries of data block `index`.
fn block_entries(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    index: u32,
) -> Result<Vec<DirDataEntry>, FsError> {
    let block = block_of(data, index)?;
    let guard = tx
        .tx
        .get_buf(BufKey::single(block.0), &spec(fs, data.core.header.blkno))?;
    dir_data_entries(guard).map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))
}

fn address_cookie(index: u32, offset: u16) -> u64 {
    dir_address(index, offset).map_or(u64::MAX, |a| u64::from(a) + COOKIE_BASE)
}

/// Every stored entry, in cookie order, with cookies greater than `after`.
pub(crate) fn entries(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    after: u64,
    limit: usize,
) -> Result<Vec<Found>, FsError> {
    let mut out = Vec::new();
    if data.core.data_format == ForkFormat::Local {
        for entry in shortform(data)?.entries {
            let cookie = u64::from(entry.tag) + COOKIE_BASE;
            if cookie > after && out.len() < limit {
                out.push(Found {
                    inode: entry.inode,
                    file_type: entry.file_type,
                    cookie,
                    name: entry.name,
                });
            }
        }
        return Ok(out);
    }
    let first = after.saturating_sub(COOKIE_BASE) >> 13;
    for index in (first as u32)..block_count(fs, data) {
        for entry in block_entries(fs, tx, data, index)? {
            let cookie = address_cookie(index, entry.offset);
            if entry.file_type == FileType::Unknown || cookie <= after {
                continue;
            }
            if out.len() >= limit {
                return Ok(out);
            }
            out.push(Found {
                inode: entry.inode,
                file_type: entry.file_type,
                cookie,
                name: entry.name,
            });
        }
    }
    Ok(out)
}

/// The entry named `name`, if any.
pub(crate) fn lookup(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    name: &[u8],
) -> Result<Option<Found>, FsError> {
    if data.core.data_format == ForkFormat::Local {
        let found = shortform(data)?
            .entries
            .into_iter()
            .find(|e| e.name == name);
        return Ok(found.map(|entry| Found {
            inode: entry.inode,
            file_type: entry.file_type,
            cookie: u64::from(entry.tag) + COOKIE_BASE,
            name: entry.name,
        }));
    }
    for index in 0..block_count(fs, data) {
        for entry in block_entries(fs, tx, data, index)? {
            if entry.file_type != FileType::Unknown && entry.name == name {
                return Ok(Some(Found {
                    inode: entry.inode,
                    file_type: entry.file_type,
                    cookie: address_cookie(index, entry.offset),
                    name: entry.name,
                }));
            }
        }
    }
    Ok(None)
}

/// The parent directory's inode number.
pub(crate) fn parent(fs: &Filesystem, tx: &mut Tx<'_>, data: &InodeData) -> Result<u64, FsError> {
    if data.core.data_format == ForkFormat::Local {
        return Ok(shortform(data)?.parent);
    }
    let entries = block_entries(fs, tx, data, 0)?;
    entries
        .iter()
        .find(|e| e.file_type == FileType::Unknown)
        .map(|e| e.inode)
        .ok_or_else(|| FsError::corrupt("directory", data.core.header.blkno, "no parent entry"))
}

/// Whether the directory has no entries.
pub(crate) fn is_empty(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
) -> Result<bool, FsError> {
    Ok(entries(fs, tx, data, 0, 1)?.is_empty())
}

/// Adds an entry (the caller checked that `name` is absent).
pub(crate) fn add(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<(), FsError> {
    // A failed add (no space for a new block) must leave the in-core inode as it was: the
    // caller commits the transaction without logging it.
    let (core, raw) = (data.core, data.raw.clone());
    let added = add_inner(fs, tx, data, name, inode, file_type);
    if added.is_err() {
        data.core = core;
        data.raw = raw;
    }
    added
}

fn add_inner(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<(), FsError> {
    if data.core.data_format == ForkFormat::Local {
        let mut dir = shortform(data)?;
        let tag = next_tag(&dir);
        if let Some(tag) = tag {
            dir.entries.push(ShortformEntry {
                tag,
                file_type,
                inode,
                name: name.to_vec(),
            });
            if store_shortform(data, &dir)? {
                return Ok(());
            }
            dir.entries.pop();
        }
        to_block_form(fs, tx, data, &dir)?;
    }
    add_to_blocks(fs, tx, data, name, inode, file_type)
}

/// The tag after the last entry's (tags only grow, so cookies are never reused while the
/// directory stays short-form).
fn next_tag(dir: &ShortformDir) -> Option<u16> {
    match dir.entries.last() {
        None => Some(1),
        Some(last) => last.tag.checked_add(1),
    }
}

/// Moves a short-form directory into a first data block.
fn to_block_form(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    dir: &ShortformDir,
) -> Result<(), FsError> {
    data.reset_data_fork(ForkFormat::Extents);
    data.core.size = 0;
    new_block(fs, tx, data, dir.parent)?;
    for entry in &dir.entries {
        add_to_blocks(fs, tx, data, &entry.name, entry.inode, entry.file_type)?;
    }
    Ok(())
}

/// Appends an empty data block (block 0 gets the parent marker); returns its index.
fn new_block(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    parent: u64,
) -> Result<u32, FsError> {
    let index = block_count(fs, data);
    let mut list = bmap::extents(data)?;
    let extent = bmap::allocate(fs, tx, data, &mut list, u64::from(index), 1, false)?;
    bmap::store(data, &list)?;
    let dir = data.core.header.blkno;
    let guard = tx
        .tx
        .get_new_buf(BufKey::single(extent.fs_block.0), &spec(fs, dir))?;
    let header = MetaHeader::new(MetaKind::DirData, extent.fs_block.0, fs.uuid, dir);
    let len = guard.len();
    let bytes = guard.bytes_mut(0..len)?;
    init_dir_data_block(bytes, header)?;
    if index == 0 {
        dir_data_insert(bytes, parent, FileType::Unknown, PARENT_MARKER)?;
    }
    data.core.size += u64::from(fs.geometry.block_size);
    Ok(index)
}

fn add_to_blocks(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<(), FsError> {
    let dir = data.core.header.blkno;
    let needed = cairn_format::dir::dir_entry_bytes(name.len());
    let body = fs.geometry.block_size as usize - DIR_DATA_HEADER_SIZE;
    if needed > body {
        return Err(FsError::NameTooLong);
    }
    for index in 0..block_count(fs, data) {
        let block = block_of(data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
        if best_free(guard) < needed {
            continue;
        }
        let len = guard.len();
        if dir_data_insert(guard.bytes_mut(0..len)?, inode, file_type, name)?.is_some() {
            return Ok(());
        }
    }
    let index = new_block(fs, tx, data, 0)?;
    let block = block_of(data, index)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let len = guard.len();
    match dir_data_insert(guard.bytes_mut(0..len)?, inode, file_type, name)? {
        Some(_) => Ok(()),
        None => Err(FsError::corrupt(
            "directory block",
            block.0,
            "new block has no room",
        )),
    }
}

/// The largest free region of a data block, from its header.
fn best_free(block: &[u8]) -> usize {
    use cairn_format::OnDisk;
    cairn_format::dir::DirDataHeader::decode(block)
        .map_or(usize::MAX, |h| usize::from(h.best_free[0].length))
}

/// Removes the entry named `name`; returns it.
pub(crate) fn remove(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
) -> Result<Found, FsError> {
    if data.core.data_format == ForkFormat::Local {
        let mut dir = shortform(data)?;
        let index = dir
            .entries
            .iter()
            .position(|e| e.name == name)
            .ok_or(FsError::NotFound)?;
        let entry = dir.entries.remove(index);
        store_shortform(data, &dir)?;
        return Ok(Found {
            inode: entry.inode,
            file_type: entry.file_type,
            cookie: u64::from(entry.tag) + COOKIE_BASE,
            name: entry.name,
        });
    }
    let dir = data.core.header.blkno;
    for index in 0..block_count(fs, data) {
        let block = block_of(data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
        let entries = dir_data_entries(guard)
            .map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))?;
        let hit = entries
            .into_iter()
            .find(|e| e.file_type != FileType::Unknown && e.name == name);
        if let Some(entry) = hit {
            let len = guard.len();
            dir_data_remove(guard.bytes_mut(0..len)?, entry.offset)?;
            return Ok(Found {
                inode: entry.inode,
                file_type: entry.file_type,
                cookie: address_cookie(index, entry.offset),
                name: entry.name,
            });
        }
    }
    Err(FsError::NotFound)
}

/// Points the entry named `name` at `inode` of type `file_type` in place (rename over an
/// existing target, exchange): the entry keeps its position, so its cookie stays valid.
/// Returns the entry as it was. Needs no space, so it cannot fail with `NoSpace`.
pub(crate) fn retarget(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<Found, FsError> {
    if data.core.data_format == ForkFormat::Local {
        let mut dir = shortform(data)?;
        let entry = dir
            .entries
            .iter_mut()
            .find(|e| e.name == name)
            .ok_or(FsError::NotFound)?;
        let old = entry.clone();
        entry.inode = inode;
        entry.file_type = file_type;
        store_shortform(data, &dir)?;
        return Ok(Found {
            inode: old.inode,
            file_type: old.file_type,
            cookie: u64::from(old.tag) + COOKIE_BASE,
            name: old.name,
        });
    }
    let found = lookup(fs, tx, data, name)?.ok_or(FsError::NotFound)?;
    let (index, offset) = split_cookie(found.cookie)?;
    let block = block_of(data, index)?;
    let guard = tx
        .tx
        .get_buf(BufKey::single(block.0), &spec(fs, data.core.header.blkno))?;
    // An entry is file_type u8 @0, name_len u8 @1, inode u64 @2 (format.md section 12).
    let at = usize::from(offset);
    guard.write(at, &[file_type.code()])?;
    guard.write(at + 2, &inode.to_le_bytes())?;
    Ok(found)
}

/// The data block index and offset of a block-form cookie.
fn split_cookie(cookie: u64) -> Result<(u32, u16), FsError> {
    let address = cookie
        .checked_sub(COOKIE_BASE)
        .and_then(|a| u32::try_from(a).ok())
        .ok_or(FsError::InvalidArgument("not a directory cookie"))?;
    Ok(cairn_format::dir::split_dir_address(address))
}

/// Changes the parent of a directory (after it moved).
pub(crate) fn set_parent(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    parent: u64,
) -> Result<(), FsError> {
    if data.core.data_format == ForkFormat::Local {
        let mut dir = shortform(data)?;
        dir.parent = parent;
        store_shortform(data, &dir)?;
        return Ok(());
    }
    let dir = data.core.header.blkno;
    let block = block_of(data, 0)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let entries = dir_data_entries(guard)
        .map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))?;
    let marker = entries
        .iter()
        .find(|e| e.file_type == FileType::Unknown)
        .ok_or_else(|| FsError::corrupt("directory", dir, "no parent entry"))?;
    // The entry's inode field sits 2 bytes into it.
    let at = usize::from(marker.offset) + 2;
    guard.write(at, &parent.to_le_bytes())?;
    Ok(())
}

/// Frees a directory's blocks when it is removed.
pub(crate) fn free_blocks(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let mut list = bmap::extents(data)?;
    let removed = bmap::cut(&mut list, 0, u64::MAX);
    for extent in &removed {
        for block in extent.fs_block.0..extent.fs_block.0 + u64::from(extent.length) {
            tx.tx
                .get_new_buf(BufKey::single(block), &spec(fs, data.core.header.blkno))?;
            tx.tx.invalidate_buf(BufKey::single(block))?;
        }
    }
    bmap::free_pieces(fs, tx, data, &removed)?;
    data.reset_data_fork(ForkFormat::Extents);
    data.core.size = 0;
    Ok(())
}
