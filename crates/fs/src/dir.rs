//! Directories: short form inside the inode while the entries fit, then data blocks mapped
//! through the directory's `FileMap` (inline extents, then an extent tree, as regular files),
//! looked up through the extent cache once the fork is a tree.
//!
//! Block form keeps the parent as the first entry of block 0 with file type `Unknown` (a
//! type no user entry has), so lookups and readdir skip it. Readdir cookies: 1 is ".", 2 is
//! "..", and an entry's cookie is its tag (short form) or data address (block form) plus 3,
//! so a cookie names a position that survives other entries coming and going.
//!
//! Space reuse: a new entry goes into the last data block if it has room, else into the
//! first block with room from the `..index` marker's free-space hint (the lowest block a
//! removal left room in; at most `HINT_SCAN_BLOCKS` blocks are tried per add, and the hint
//! moves past blocks that had no room for the name), else into a new block. Freeing a removed
//! directory goes a few blocks per transaction (`free_blocks_in_steps`).

use cairn_bufcache::{BufKey, BufferOps, HeaderOps, ReadSpec};
use cairn_format::dir::{
    DIR_DATA_HEADER_SIZE, DirDataEntryRef, ShortformDir, ShortformEntry, dir_address,
    dir_data_check, dir_data_entry_at, dir_data_insert, dir_data_insert_at, dir_data_iter,
    dir_data_remove, dir_entry_bytes, init_dir_data_block, name_hash, split_dir_address,
};
use cairn_format::inode::{FileType, ForkFormat};
use cairn_format::{Extent, FormatError, FsBlock, Lsn, MetaHeader, MetaKind};
use cairn_journal::{IntentId, Reservation};

use crate::FsError;
use crate::bmap::{
    self, EXTENTS_PER_STEP, FileMap, Mapping, Placement, free_intent, step_reservation,
};
use crate::dir_index::{self, IndexCtx, IndexMarker, loaded_map};
use crate::fs::Filesystem;
use crate::glue::Tx;
use crate::inode::InodeData;

static DIR_DATA_OPS: DirDataOps = DirDataOps;

/// The data block verifier: the common header, then the whole structure (regions tile the
/// body, entries valid, best-free exact), on every read from disk and before every write
/// home. So a cached block's tiling holds, and lookups read single entries in place
/// instead of decoding the block each time.
#[derive(Debug)]
struct DirDataOps;

const DIR_DATA_HEADER: HeaderOps = HeaderOps::new(MetaKind::DirData);

impl BufferOps for DirDataOps {
    fn name(&self) -> &'static str {
        DIR_DATA_HEADER.name()
    }

    fn verify_read(&self, block: &[u8], at: FsBlock, spec: &ReadSpec) -> Result<(), FormatError> {
        DIR_DATA_HEADER.verify_read(block, at, spec)?;
        dir_data_check(block)
    }

    fn prepare_write(
        &self,
        block: &mut [u8],
        at: FsBlock,
        lsn: Option<Lsn>,
    ) -> Result<(), FormatError> {
        dir_data_check(block)?;
        DIR_DATA_HEADER.prepare_write(block, at, lsn)
    }

    fn kind(&self) -> Option<MetaKind> {
        DIR_DATA_HEADER.kind()
    }
}

/// The name of the parent marker entry in block form (its type `Unknown` is what marks it).
const PARENT_MARKER: &[u8] = b"..parent";
/// The marker entry holding the hash index root (see `dir_index.rs`).
const INDEX_MARKER: &[u8] = b"..index";
/// Where the first user entry of data block 0 goes: after the two markers.
const FIRST_ENTRY_OFFSET: u32 =
    (DIR_DATA_HEADER_SIZE + dir_entry_bytes(PARENT_MARKER.len()) + dir_entry_bytes(7)) as u32;
/// Cookie offset of stored entries: 0 = start, 1 = ".", 2 = "..".
const COOKIE_BASE: u64 = 3;
/// Blocks an add tries from the free-space hint before it appends a block.
const HINT_SCAN_BLOCKS: u32 = 4;
/// Data blocks a step of freeing a removed directory unmaps (each buffer is invalidated).
const FREE_STEP_BLOCKS: u64 = 64;

/// A found entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub inode: u64,
    pub file_type: FileType,
    pub cookie: u64,
    pub name: Vec<u8>,
}

impl Found {
    fn from_block(entry: &DirDataEntryRef<'_>, cookie: u64) -> Self {
        Self {
            inode: entry.inode,
            file_type: entry.file_type,
            cookie,
            name: entry.name.to_vec(),
        }
    }
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

/// The device block of data block `index`: from the inline extents, or through the extent
/// cache for a tree fork (a miss reads the whole map through `tx`). Every map change goes
/// through `FileMap::store` under the directory's metadata lock, which keeps the cache true.
fn block_of(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    index: u32,
) -> Result<FsBlock, FsError> {
    let number = data.core.header.blkno;
    let mapping = match data.core.data_format {
        ForkFormat::Btree => {
            let cached = fs.data_cache.inode(number, data.core.generation);
            crate::extents::lookup(&cached, u64::from(index), || {
                Ok(FileMap::load(fs, tx, number, data)?.extents().to_vec())
            })?
        }
        _ => bmap::map(&bmap::extents(data)?, u64::from(index)),
    };
    match mapping {
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

/// Runs `read` on the bytes of data block `index`, a corrupt block reported by its number.
fn with_block<T>(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    index: u32,
    read: impl FnOnce(&[u8]) -> Result<T, FormatError>,
) -> Result<T, FsError> {
    let block = block_of(fs, tx, data, index)?;
    let guard = tx
        .tx
        .get_buf(BufKey::single(block.0), &spec(fs, data.core.header.blkno))?;
    read(guard).map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))
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
        let full = with_block(fs, tx, data, index, |block| {
            for entry in dir_data_iter(block) {
                let entry = entry?;
                let cookie = address_cookie(index, entry.offset);
                if entry.file_type == FileType::Unknown || cookie <= after {
                    continue;
                }
                if out.len() >= limit {
                    return Ok(true);
                }
                out.push(Found::from_block(&entry, cookie));
            }
            Ok(false)
        })?;
        if full {
            break;
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
    let tree = dir_index::open(fs, data.core.header.blkno, index_marker(fs, tx, data)?)?;
    dir_index::probe(&tree, tx, name_hash(name), |tx, record| {
        let cookie = u64::from(record.address) + COOKIE_BASE;
        let found = with_entry(fs, tx, data, record.address, |entry| {
            (entry.name == name).then(|| Found::from_block(&entry, cookie))
        })?;
        Ok(found.map(|found| (found, record.hash)))
    })
}

/// Runs `read` on the live entry at data address `address` (the index names it, so it
/// must exist), read in place.
fn with_entry<T>(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    address: u32,
    read: impl FnOnce(DirDataEntryRef<'_>) -> T,
) -> Result<T, FsError> {
    let dir = data.core.header.blkno;
    let missing = || {
        let detail = format!("address {address:#x} names no entry");
        FsError::corrupt("directory index", dir, detail)
    };
    let (index, offset) = split_dir_address(address);
    if index >= block_count(fs, data) {
        return Err(missing());
    }
    with_block(fs, tx, data, index, |block| {
        let entry = dir_data_entry_at(block, offset)?;
        Ok(entry.filter(|e| e.file_type != FileType::Unknown).map(read))
    })?
    .ok_or_else(missing)
}

/// The offset and inode field of marker entry `name` in data block 0.
fn find_marker(block: &[u8], name: &[u8]) -> Result<Option<(u16, u64)>, FormatError> {
    for entry in dir_data_iter(block) {
        let entry = entry?;
        if entry.file_type == FileType::Unknown && entry.name == name {
            return Ok(Some((entry.offset, entry.inode)));
        }
    }
    Ok(None)
}

/// The inode field of marker entry `name` in data block 0.
fn marker(fs: &Filesystem, tx: &mut Tx<'_>, data: &InodeData, name: &[u8]) -> Result<u64, FsError> {
    with_block(fs, tx, data, 0, |block| find_marker(block, name))?
        .map(|(_, value)| value)
        .ok_or_else(|| FsError::corrupt("directory", data.core.header.blkno, "a marker is missing"))
}

/// The `..index` marker: index root and free-space hint.
fn index_marker(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
) -> Result<IndexMarker, FsError> {
    Ok(IndexMarker::unpack(marker(fs, tx, data, INDEX_MARKER)?))
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
    let block = block_of(fs, tx, data, 0)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let (offset, _) = find_marker(guard, name)
        .map_err(|e| FsError::corrupt("directory block", block.0, e.to_string()))?
        .ok_or_else(|| FsError::corrupt("directory", dir, "a marker is missing"))?;
    // The entry's inode field sits 2 bytes into it.
    let at = usize::from(offset) + 2;
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

/// Adds an entry (the caller checked that `name` is absent). On failure the directory is
/// consistent and, when it changed in `tx`, logged there: a failed move to blocks is undone
/// (its blocks freed, the short form restored); a failure in block form keeps what `tx`
/// changed (an empty new block at most), which the caller commits.
pub(crate) fn add(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    name: &[u8],
    inode: u64,
    file_type: FileType,
) -> Result<(), FsError> {
    let mut map = None;
    if data.core.data_format == ForkFormat::Local {
        let mut dir = shortform(data)?;
        if let Some(tag) = next_tag(&dir, name.len(), fs.geometry.block_size) {
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
        let (core, raw) = (data.core, data.raw.clone());
        if let Err(error) = to_block_form(fs, tx, data, &mut map, &dir) {
            let number = data.core.header.blkno;
            bmap::release_inline(fs, tx, data, &spec(fs, number))?;
            data.core = core;
            data.raw = raw;
            return Err(error);
        }
    }
    let added = add_to_blocks(fs, tx, data, &mut map, name, inode, file_type);
    if added.is_err() {
        crate::fs::Filesystem::log_inode(tx, data.core.header.blkno, data);
    }
    added
}

/// Joins and invalidates the buffers of `extents` (directory blocks about to be freed).
fn invalidate_blocks(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    dir: u64,
    extents: &[Extent],
) -> Result<(), FsError> {
    bmap::invalidate_extents(tx, extents, &spec(fs, dir))
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
    map: &mut Option<FileMap>,
    dir: &ShortformDir,
) -> Result<(), FsError> {
    data.reset_data_fork(ForkFormat::Extents);
    data.core.size = 0;
    *map = None;
    new_block(fs, tx, data, map, dir.parent)?;
    let number = data.core.header.blkno;
    let marker = {
        let mut ctx = IndexCtx::new(tx, fs, data, map);
        dir_index::create(&mut ctx, number)?
    };
    set_marker(fs, tx, data, INDEX_MARKER, marker.pack())?;
    for entry in &dir.entries {
        let (index, offset) = split_dir_address(u32::from(entry.tag));
        while block_count(fs, data) <= index {
            new_block(fs, tx, data, map, 0)?;
        }
        let block = block_of(fs, tx, data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, number))?;
        let len = guard.len();
        let bytes = guard.bytes_mut(0..len)?;
        let (name, inode, file_type) = (&entry.name, entry.inode, entry.file_type);
        if dir_data_insert_at(bytes, offset, inode, file_type, name)? {
            index_insert(fs, tx, data, map, name, u32::from(entry.tag))?;
        } else {
            // A tag from before tags were addresses: the entry's cookie changes once.
            add_to_blocks(fs, tx, data, map, name, inode, file_type)?;
        }
    }
    Ok(())
}

/// Adds `address` for `name` to the index and records a new root in the marker.
fn index_insert(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    map: &mut Option<FileMap>,
    name: &[u8],
    address: u32,
) -> Result<(), FsError> {
    let number = data.core.header.blkno;
    let before = index_marker(fs, tx, data)?;
    let mut tree = dir_index::open(fs, number, before)?;
    {
        let mut ctx = IndexCtx::new(tx, fs, data, map);
        let inserted = dir_index::insert(&mut tree, &mut ctx, name_hash(name), address);
        // A failed insert gives back the split blocks it took; frees are deferred.
        let freed = ctx.take_freed();
        tx.defer_free(freed);
        inserted?;
    }
    let after = before.with_tree(&tree);
    if after != before {
        set_marker(fs, tx, data, INDEX_MARKER, after.pack())?;
    }
    Ok(())
}

/// Appends an empty data block (block 0 gets the parent and index markers); returns its index.
fn new_block(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    map: &mut Option<FileMap>,
    parent: u64,
) -> Result<u32, FsError> {
    let index = block_count(fs, data);
    let dir = data.core.header.blkno;
    if dir_address(index, 0).is_none() {
        // Data addresses hold 19 bits of block index.
        return Err(FsError::NoSpace);
    }
    let map = loaded_map(fs, tx, data, map)?;
    let extent = map.allocate(fs, tx, data, u64::from(index), 1, Placement::near(false))?;
    map.store(fs, tx, data)?;
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

/// Adds an entry to a data block with room (`place_entry`), then indexes it. If the index
/// cannot take it, the entry is taken out again.
fn add_to_blocks(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    map: &mut Option<FileMap>,
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
    let new = NewEntry {
        name,
        inode,
        file_type,
    };
    let blocks_before = block_count(fs, data);
    let (index, offset) = place_entry(fs, tx, data, map, &new)?;
    let address = dir_address(index, offset)
        .ok_or_else(|| FsError::corrupt("directory", dir, "data address out of range"))?;
    if let Err(error) = index_insert(fs, tx, data, map, name, address) {
        let block = block_of(fs, tx, data, index)?;
        let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
        let len = guard.len();
        dir_data_remove(guard.bytes_mut(0..len)?, offset)?;
        if index >= blocks_before {
            // The block is this add's and empty again: the directory gives it back.
            drop_new_block(fs, tx, data, map, index)?;
        }
        return Err(error);
    }
    Ok(())
}

/// Takes back data block `index`, the directory's last, which a failed add allocated in `tx`
/// and left empty: unmapped, invalidated (so no logged image of it is ever replayed over its
/// next owner) and freed in `tx`, whose AG locks cover it.
fn drop_new_block(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    map: &mut Option<FileMap>,
    index: u32,
) -> Result<(), FsError> {
    debug_assert_eq!(index + 1, block_count(fs, data), "only the last block goes");
    let dir = data.core.header.blkno;
    let map = loaded_map(fs, tx, data, map)?;
    let removed = map.cut(u64::from(index), u64::from(index) + 1);
    map.store(fs, tx, data)?;
    invalidate_blocks(fs, tx, dir, &removed)?;
    bmap::free_pieces(fs, tx, data, &removed)?;
    data.core.size -= u64::from(fs.geometry.block_size);
    Ok(())
}

/// An entry to place.
struct NewEntry<'n> {
    name: &'n [u8],
    inode: u64,
    file_type: FileType,
}

/// Puts the entry into the last data block, a block the free-space hint leads to, or a new
/// block; returns its block index and offset.
fn place_entry(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    map: &mut Option<FileMap>,
    new: &NewEntry<'_>,
) -> Result<(u32, u16), FsError> {
    let last = block_count(fs, data).saturating_sub(1);
    if let Some(offset) = insert_in_block(fs, tx, data, last, new)? {
        return Ok((last, offset));
    }
    if let Some(placed) = place_by_hint(fs, tx, data, last, new)? {
        return Ok(placed);
    }
    let index = new_block(fs, tx, data, map, 0)?;
    let offset = insert_in_block(fs, tx, data, index, new)?.ok_or_else(|| {
        FsError::corrupt("directory", data.core.header.blkno, "new block has no room")
    })?;
    Ok((index, offset))
}

/// Tries up to `HINT_SCAN_BLOCKS` blocks from the free-space hint (below the last block,
/// which the caller tried). The hint moves past the blocks that had no room for this name; a
/// removal in one of them moves it back.
fn place_by_hint(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    last: u32,
    new: &NewEntry<'_>,
) -> Result<Option<(u32, u16)>, FsError> {
    let marker = index_marker(fs, tx, data)?;
    let Some(hint) = marker.free_hint else {
        return Ok(None);
    };
    let mut placed = None;
    let mut next = hint;
    while next < last && next < hint.saturating_add(HINT_SCAN_BLOCKS) {
        if let Some(offset) = insert_in_block(fs, tx, data, next, new)? {
            placed = Some((next, offset));
            break;
        }
        next += 1;
    }
    let free_hint = (next < last).then_some(next);
    if free_hint != marker.free_hint {
        let moved = IndexMarker {
            free_hint,
            ..marker
        };
        set_marker(fs, tx, data, INDEX_MARKER, moved.pack())?;
    }
    Ok(placed)
}

/// Inserts an entry into data block `index` if it has room; returns its offset.
fn insert_in_block(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    index: u32,
    new: &NewEntry<'_>,
) -> Result<Option<u16>, FsError> {
    let block = block_of(fs, tx, data, index)?;
    let guard = tx
        .tx
        .get_buf(BufKey::single(block.0), &spec(fs, data.core.header.blkno))?;
    if best_free(guard) < dir_entry_bytes(new.name.len()) {
        return Ok(None);
    }
    let len = guard.len();
    Ok(dir_data_insert(
        guard.bytes_mut(0..len)?,
        new.inode,
        new.file_type,
        new.name,
    )?)
}

/// The largest free region of a data block, from its header.
fn best_free(block: &[u8]) -> usize {
    use cairn_format::OnDisk;
    cairn_format::dir::DirDataHeader::decode(block)
        .map_or(usize::MAX, |h| usize::from(h.best_free[0].length))
}

/// Removes the entry named `name`; returns it. The room it leaves is reusable: the
/// free-space hint moves down to its block.
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
    let block = block_of(fs, tx, data, index)?;
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec(fs, dir))?;
    let len = guard.len();
    dir_data_remove(guard.bytes_mut(0..len)?, offset)?;
    let before = index_marker(fs, tx, data)?;
    let mut tree = dir_index::open(fs, dir, before)?;
    let mut map = None;
    {
        let mut ctx = IndexCtx::new(tx, fs, data, &mut map);
        dir_index::remove(&mut tree, &mut ctx, key, |ctx, address| {
            with_entry(ctx.fs, ctx.tx, ctx.data, address, |entry| {
                name_hash(entry.name)
            })
        })?;
        let freed = ctx.take_freed();
        tx.defer_free(freed);
    }
    let mut after = before.with_tree(&tree);
    let last = block_count(fs, data).saturating_sub(1);
    if index < last && after.free_hint.is_none_or(|hint| index < hint) {
        after.free_hint = Some(index);
    }
    if after != before {
        set_marker(fs, tx, data, INDEX_MARKER, after.pack())?;
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
    let block = block_of(fs, tx, data, index)?;
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

/// The last freeing step of a removed directory: what `free_blocks_in_steps` left (data
/// block 0 and the index root), unmapped and invalidated under a free intent as every other
/// step, then freed in a second transaction. The inode's own final transaction then touches
/// no directory block: it locks only its AG's AGI and AGF, in that order (docs/fs.md).
pub(crate) fn free_remaining_blocks(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    if data.core.data_format == ForkFormat::Local {
        return Ok(());
    }
    let mut tx = fs.begin(free_step_reservation(fs))?;
    let mut map = FileMap::load(fs, &mut tx, number, data)?;
    let removed = map.cut(0, u64::MAX);
    invalidate_blocks(fs, &mut tx, number, &removed)?;
    data.core.size = 0;
    if removed.is_empty() {
        Filesystem::log_inode(&mut tx, number, data);
        fs.commit(tx, &mut [data])?;
        return Ok(());
    }
    bmap::commit_unmap(fs, tx, number, data, &mut map, &removed)
}

/// One freeing step's reservation: the unmap and free, and the invalidation of its blocks.
fn free_step_reservation(fs: &Filesystem) -> Reservation {
    let invalidations = Reservation::for_items(
        &fs.geometry,
        FREE_STEP_BLOCKS as u32,
        fs.geometry.block_size,
        0,
        0,
    );
    Reservation::new(step_reservation(fs).bytes + invalidations.bytes)
}

/// Unmaps and frees the data blocks after block 0 of a removed (empty) directory, at most
/// `FREE_STEP_BLOCKS` blocks and `EXTENTS_PER_STEP` extents per step, from the end: each step
/// invalidates the blocks, shrinks the directory and names them in a free intent, and a
/// second transaction frees them and logs the done item, as the data path's unmaps. Every
/// step leaves an empty directory of fewer blocks; the index (one root leaf once empty)
/// stays for `free_remaining_blocks`.
pub(crate) fn free_blocks_in_steps(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
) -> Result<(), FsError> {
    let block_size = u64::from(fs.geometry.block_size);
    let reservation = free_step_reservation(fs);
    while data.core.data_format != ForkFormat::Local && block_count(fs, data) > 1 {
        let end = u64::from(block_count(fs, data));
        let mut tx = fs.begin(reservation)?;
        let mut map = FileMap::load(fs, &mut tx, number, data)?;
        let mut removed = map.cut(end.saturating_sub(FREE_STEP_BLOCKS).max(1), end);
        if removed.len() > EXTENTS_PER_STEP {
            let kept = removed.len() - EXTENTS_PER_STEP;
            for piece in removed.drain(..kept) {
                map.insert(piece);
            }
        }
        let start = removed.first().map_or(1, |piece| piece.file_block);
        invalidate_blocks(fs, &mut tx, number, &removed)?;
        data.core.size = start * block_size;
        if removed.is_empty() {
            // A hole at the end: only the size shrinks.
            Filesystem::log_inode(&mut tx, number, data);
            fs.commit(tx, &mut [data])?;
            continue;
        }
        bmap::commit_unmap(fs, tx, number, data, &mut map, &removed)?;
    }
    Ok(())
}

/// Frees the blocks a committed transaction deferred (`Tx::deferred_frees`), one
/// transaction per intent, in ascending block order.
pub(crate) fn finish_deferred_frees(
    fs: &Filesystem,
    deferred: Vec<(IntentId, Vec<Extent>)>,
) -> Result<(), FsError> {
    for (intent, removed) in deferred {
        free_intent(fs, intent, &removed)?;
    }
    Ok(())
}
