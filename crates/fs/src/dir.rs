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
    dir_data_entries, dir_data_insert, dir_data_insert_at, dir_data_remove, dir_entry_bytes,
    init_dir_data_block, name_hash, split_dir_address,
};
use cairn_format::inode::{FileType, ForkFormat};
use cairn_format::{FsBlock, MetaHeader, MetaKind};

use crate::FsError;
use crate::bmap::{self, Mapping};
use crate::dir_index::{self, IndexCtx};
use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::InodeData;

static DIR_DATA_OPS: HeaderOps = HeaderOps::new(MetaKind::DirData);

/// The name of the parent marker entry in block form (its type `Unknown` is what marks it).
const PARENT_MARKER: &[u8] = b"..parent";
/// The marker entry holding the hash index root (see `dir_index.rs`).
const INDEX_MARKER: &[u8] = b"..index";
/// Where the first user entry of data block 0 goes: after the two markers.
const FIRST_ENTRY_OFFSET: u32 =
    (DIR_DATA_HEADER_SIZE + dir_entry_bytes(PARENT_MARKER.len()) + dir_entry_bytes(7)) as u32;
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
    Ok(indexed_lookup(fs, tx, data, name)?.map(|(found, _)| found))
}

/// Looks `name` up through the hash index; returns the entry and its index key.
fn indexed_lookup(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    name: &[u8],
) -> Result<Option<(Found, u32)>, FsError> {
    let tree = dir_index::open(
        fs,
        data.core.header.blkno,
        marker(fs, tx, data, INDEX_MARKER)?,
    )?;
    dir_index::probe(&tree, tx, name_hash(name), |tx, record| {
        let entry = entry_at(fs, tx, data, record.address)?;
        Ok((entry.name == name).then(|| {
            let found = Found {
                inode: entry.inode,
                file_type: entry.file_type,
                cookie: u64::from(record.address) + COOKIE_BASE,
                name: entry.name,
            };
            (found, record.hash)
        }))
    })
}

/// The live entry at data address `address` (the index names it, so it must exist).
fn entry_at(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    address: u32,
) -> Result<DirDataEntry, FsError> {
    let (index, offset) = split_dir_address(address);
    if index >= block_count(fs, data) {
        return Err(FsError::corrupt(
            "directory index",
            data.core.header.blkno,
            format!("address {address:#x} past the last data block"),
        ));
    }
    block_entries(fs, tx, data, index)?
        .into_iter()
        .find(|e| e.offset == offset && e.file_type != FileType::Unknown)
        .ok_or_else(|| {
            let detail = format!("address {address:#x} names no entry");
            FsError::corrupt("directory index", data.core.header.blkno, detail)
        })
}

/// The inode field of marker entry `name` in data block 0.
fn marker(fs: &Filesystem, tx: &mut Tx<'_>, data: &InodeData, name: &[u8]) -> Result<u64, FsError> {
    block_entries(fs, tx, data, 0)?
        .into_iter()
        .find(|e| e.file_type == FileType::Unknown && e.name == name)
        .map(|e| e.inode)
        .ok_or_else(|| FsError::corrupt("directory", data.core.header.blkno, "a marker is missing"))
}

/// Sets the inode field of marker entry `name` in data block 0.
fn set_marker(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    name: &[u8],
    value: u64,
) -> Result<(), FsError> {
    let dir = data.core.header.blkno;
    let block = block_of(data, 0)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let entries = dir_data_entries(guard)
        .map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))?;
    let found = entries
        .iter()
        .find(|e| e.file_type == FileType::Unknown && e.name == name)
        .ok_or_else(|| FsError::corrupt("directory", dir, "a marker is missing"))?;
    // The entry's inode field sits 2 bytes into it.
    let at = usize::from(found.offset) + 2;
    guard.write(at, &value.to_le_bytes())?;
    Ok(())
}

/// The parent directory's inode number.
pub(crate) fn parent(fs: &Filesystem, tx: &mut Tx<'_>, data: &InodeData) -> Result<u64, FsError> {
    if data.core.data_format == ForkFormat::Local {
        return Ok(shortform(data)?.parent);
    }
    marker(fs, tx, data, PARENT_MARKER)
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
        let tag = next_tag(&dir, name.len(), fs.geometry.block_size);
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

/// The tag of a new entry with a `name_len`-byte name: the data address the entry would get
/// if the short-form entries were laid out in data blocks in tag order, so the move to blocks
/// can keep every cookie (`to_block_form`). Tags only grow; `None` when they run out.
fn next_tag(dir: &ShortformDir, name_len: usize, block_size: u32) -> Option<u16> {
    let needed = dir_entry_bytes(name_len);
    let position = match dir.entries.last() {
        None => FIRST_ENTRY_OFFSET / 8,
        Some(last) => u32::from(last.tag) + (dir_entry_bytes(last.name.len()) / 8) as u32,
    };
    let (index, offset) = split_dir_address(position);
    let address = if usize::from(offset) + needed > block_size as usize {
        dir_address(index + 1, DIR_DATA_HEADER_SIZE as u16)?
    } else {
        position
    };
    u16::try_from(address).ok()
}

/// Moves a short-form directory into data blocks with a hash index. Every entry goes to the
/// data address its tag names, so cookies handed out in short form stay valid.
fn to_block_form(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    dir: &ShortformDir,
) -> Result<(), FsError> {
    data.reset_data_fork(ForkFormat::Extents);
    data.core.size = 0;
    new_block(fs, tx, data, dir.parent)?;
    let number = data.core.header.blkno;
    let root = {
        let mut ctx = IndexCtx { tx, fs, data };
        dir_index::create(&mut ctx, number)?
    };
    set_marker(fs, tx, data, INDEX_MARKER, root)?;
    for entry in &dir.entries {
        let (index, offset) = split_dir_address(u32::from(entry.tag));
        while block_count(fs, data) <= index {
            new_block(fs, tx, data, 0)?;
        }
        let block = block_of(data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, number))?;
        let len = guard.len();
        let bytes = guard.bytes_mut(0..len)?;
        let (name, inode, file_type) = (&entry.name, entry.inode, entry.file_type);
        if dir_data_insert_at(bytes, offset, inode, file_type, name)? {
            index_insert(fs, tx, data, name, u32::from(entry.tag))?;
        } else {
            // A tag from before tags were addresses: the entry's cookie changes once.
            add_to_blocks(fs, tx, data, name, inode, file_type)?;
        }
    }
    Ok(())
}

/// Adds `address` for `name` to the index and records a new root in the marker.
fn index_insert(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    address: u32,
) -> Result<(), FsError> {
    let number = data.core.header.blkno;
    let packed = marker(fs, tx, data, INDEX_MARKER)?;
    let mut tree = dir_index::open(fs, number, packed)?;
    {
        let mut ctx = IndexCtx { tx, fs, data };
        dir_index::insert(&mut tree, &mut ctx, name_hash(name), address)?;
    }
    let now = dir_index::pack_root(tree.root(), tree.levels());
    if now != packed {
        set_marker(fs, tx, data, INDEX_MARKER, now)?;
    }
    Ok(())
}

/// Appends an empty data block (block 0 gets the parent and index markers); returns its index.
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
        // The index marker's value is set once the index exists; 1 is a placeholder that no
        // reader sees (the conversion finishes in this transaction).
        dir_data_insert(bytes, parent, FileType::Unknown, PARENT_MARKER)?;
        dir_data_insert(bytes, 1, FileType::Unknown, INDEX_MARKER)?;
    }
    data.core.size += u64::from(fs.geometry.block_size);
    Ok(index)
}

/// Adds an entry to the last data block, or to a new one when it has no room; then indexes
/// it. If the index cannot take it, the entry is taken out again.
fn add_to_blocks(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<(), FsError> {
    let dir = data.core.header.blkno;
    let needed = dir_entry_bytes(name.len());
    let body = fs.geometry.block_size as usize - DIR_DATA_HEADER_SIZE;
    if needed > body {
        return Err(FsError::NameTooLong);
    }
    let mut index = block_count(fs, data).saturating_sub(1);
    let mut placed = insert_in_block(fs, tx, data, index, name, inode, file_type)?;
    if placed.is_none() {
        index = new_block(fs, tx, data, 0)?;
        placed = insert_in_block(fs, tx, data, index, name, inode, file_type)?;
    }
    let Some(offset) = placed else {
        return Err(FsError::corrupt("directory", dir, "new block has no room"));
    };
    let address = dir_address(index, offset)
        .ok_or_else(|| FsError::corrupt("directory", dir, "data address out of range"))?;
    if let Err(error) = index_insert(fs, tx, data, name, address) {
        let block = block_of(data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
        let len = guard.len();
        dir_data_remove(guard.bytes_mut(0..len)?, offset)?;
        return Err(error);
    }
    Ok(())
}

/// Inserts an entry into data block `index` if it has room; returns its offset.
fn insert_in_block(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    index: u32,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<Option<u16>, FsError> {
    let block = block_of(data, index)?;
    let guard = tx
        .tx
        .get_buf(BufKey::single(block.0), &spec(fs, data.core.header.blkno))?;
    if best_free(guard) < dir_entry_bytes(name.len()) {
        return Ok(None);
    }
    let len = guard.len();
    Ok(dir_data_insert(
        guard.bytes_mut(0..len)?,
        inode,
        file_type,
        name,
    )?)
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
    let (found, key) = indexed_lookup(fs, tx, data, name)?.ok_or(FsError::NotFound)?;
    let (index, offset) = split_cookie(found.cookie)?;
    let dir = data.core.header.blkno;
    let block = block_of(data, index)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let len = guard.len();
    dir_data_remove(guard.bytes_mut(0..len)?, offset)?;
    let packed = marker(fs, tx, data, INDEX_MARKER)?;
    let mut tree = dir_index::open(fs, dir, packed)?;
    {
        let mut ctx = IndexCtx { tx, fs, data };
        dir_index::remove(&mut tree, &mut ctx, key, |ctx, address| {
            let entry = entry_at(ctx.fs, ctx.tx, ctx.data, address)?;
            Ok(name_hash(&entry.name))
        })?;
    }
    let now = dir_index::pack_root(tree.root(), tree.levels());
    if now != packed {
        set_marker(fs, tx, data, INDEX_MARKER, now)?;
    }
    Ok(found)
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
    set_marker(fs, tx, data, PARENT_MARKER, parent)
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
