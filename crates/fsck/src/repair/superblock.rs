//! Before anything else: the primary superblock, rebuilt from the secondary copies at the
//! start of every other AG when it does not verify or disagrees with most of them (as
//! xfs_repair does). The copies are found with the geometry the primary claims (even
//! unverified) and, failing that, by scanning the device for a verified copy of AG 1 or later.
//! The copies, and the primary if it verifies, vote; a candidate whose filesystem does not fit
//! the device is dropped. The counters are recomputed later by the space phase.

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};
use cairn_format::agf::Agf;
use cairn_format::agi::Agi;
use cairn_format::dir::{ShortformDir, dir_data_entries};
use cairn_format::header::stamp;
use cairn_format::inode::{FileType, ForkFormat, InodeCore, fork_extents, local_bytes};
use cairn_format::limits::{AG_AGF_BLOCK, AG_AGFL_BLOCK, AG_AGI_BLOCK};
use cairn_format::limits::{BLOCK_SIZE_MAX, BLOCK_SIZE_MIN};
use cairn_format::log::{LOG_RECORD_HEADER_BYTES, LogRecordHeader, log_header_crc};
use cairn_format::ondisk::get_u32;
use cairn_format::{
    Expected, FormatError, FsBlock, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk, Superblock,
    verify_header,
};

/// Bytes read at a time by the scan for a copy.
const SCAN_BYTES: u64 = 8 << 20;
/// Log blocks read for evidence when the copies tie (a record at its own place counts).
const LOG_EVIDENCE_BLOCKS: u64 = 64;

/// What became of the primary superblock.
#[derive(Debug)]
pub(crate) enum Primary {
    /// It verifies and the copies do not outvote it.
    Kept(Superblock),
    /// It was rewritten from the copies: the superblock now on disk, and what was wrong.
    Rewritten { superblock: Superblock, why: String },
    /// It is unusable and no copy could replace it.
    Lost,
}

/// Decides the primary superblock by vote of the copies, rewriting it if it loses.
pub(crate) fn settle_primary(
    device: &dyn BlockDevice,
    primary: &Result<Superblock, FormatError>,
) -> Result<Primary, DeviceError> {
    let copies = find_copies(device, primary);
    let device_bytes = device.size_bytes();
    let fits = |sb: &Superblock| {
        let g = sb.geometry;
        g.block_count.saturating_mul(u64::from(g.block_size)) <= device_bytes
    };
    let mut votes: Vec<(Superblock, Vec<u32>)> = Vec::new();
    let ballots = primary
        .iter()
        .map(|sb| (0, sb))
        .chain(copies.iter().map(|(a, sb)| (*a, sb)));
    for (ag, sb) in ballots.filter(|(_, sb)| fits(sb)) {
        let key = normalized(sb);
        match votes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ags)) => ags.push(ag),
            None => votes.push((key, vec![ag])),
        }
    }
    // Most votes wins; on a tie (two AGs: the primary against its one copy), the one the
    // rest of the filesystem agrees with; then the earliest group (the primary's).
    let most = votes.iter().map(|(_, ags)| ags.len()).max().unwrap_or(0);
    let tied = votes.iter().filter(|(_, ags)| ags.len() == most).count() > 1;
    let score = |sb: &Superblock| if tied { evidence(device, sb) } else { 0 };
    let winner = votes
        .iter()
        .rev()
        .max_by_key(|(sb, ags)| (ags.len(), score(sb)))
        .cloned();
    let Some((winner, ags)) = winner else {
        // Nothing fits the device: a verified primary stays (the check reports the rest).
        return Ok(match primary {
            Ok(sb) => Primary::Kept(sb.clone()),
            Err(_) => Primary::Lost,
        });
    };
    let voters = copies.len() + usize::from(primary.is_ok());
    let tally = format!("{} of {voters} superblocks agree", ags.len());
    let why = match primary {
        Ok(sb) if ags.contains(&0) => return Ok(Primary::Kept(sb.clone())),
        Ok(_) => "it disagrees with most of the copies".to_string(),
        Err(err) => err.to_string(),
    };
    let superblock = write_primary(device, &winner)?;
    let from: Vec<String> = ags.iter().map(u32::to_string).collect();
    let why = format!(
        "{why}; rebuilt from the copy in AG {} ({tally})",
        from.join(", ")
    );
    Ok(Primary::Rewritten { superblock, why })
}

/// How many structures the filesystem described by `sb` would find where it expects them:
/// each AG's AGF, AGI and AGFL verifying (its geometry and UUID), the root inode verifying as
/// a directory, and log records whose LSN names the place they sit in its log.
fn evidence(device: &dyn BlockDevice, sb: &Superblock) -> u32 {
    let g = sb.geometry;
    let uuid = sb.uuid();
    let block = |at: u64| read(device, g.byte_offset(FsBlock(at)), g.block_size);
    let mut score = 0;
    for ag in 0..g.ag_count {
        let expected = |kind, offset: u32| Expected {
            kind,
            blkno: g.ag_start(ag) + u64::from(offset),
            uuid,
            owner: Some(u64::from(ag)),
        };
        let at = |offset: u32| g.ag_start(ag) + u64::from(offset);
        let agf = block(at(AG_AGF_BLOCK))
            .is_some_and(|raw| Agf::read(&raw, &expected(MetaKind::Agf, AG_AGF_BLOCK), &g).is_ok());
        let agi = block(at(AG_AGI_BLOCK))
            .is_some_and(|raw| Agi::read(&raw, &expected(MetaKind::Agi, AG_AGI_BLOCK), &g).is_ok());
        let agfl = block(at(AG_AGFL_BLOCK)).is_some_and(|raw| {
            verify_header(&raw, &expected(MetaKind::Agfl, AG_AGFL_BLOCK)).is_ok()
        });
        score += u32::from(agf) + u32::from(agi) + u32::from(agfl);
    }
    score + u32::from(root_is_its_own_parent(device, sb)) + placed_log_records(device, sb)
}

/// Whether `sb`'s root inode verifies as a directory whose `..` names itself.
fn root_is_its_own_parent(device: &dyn BlockDevice, sb: &Superblock) -> bool {
    let g = sb.geometry;
    let root = sb.root_inode;
    let block = |at: u64| read(device, g.byte_offset(FsBlock(at)), g.block_size);
    let Some((at, offset)) = g.inode_position(InodeNumber(root)) else {
        return false;
    };
    let expected = Expected {
        kind: MetaKind::Inode,
        blkno: root,
        uuid: sb.uuid(),
        owner: Some(root),
    };
    let Some(raw) = block(at.0) else {
        return false;
    };
    let raw = &raw[offset..offset + g.inode_size as usize];
    let Ok(core) = InodeCore::read(raw, &expected) else {
        return false;
    };
    let fork = &raw[core.data_fork_range(g.inode_size)];
    let parent = match core.data_format {
        _ if core.file_type() != Some(FileType::Directory) => None,
        ForkFormat::Local => local_bytes(fork, core.size)
            .and_then(ShortformDir::decode)
            .ok()
            .map(|dir| dir.parent),
        ForkFormat::Extents => fork_extents(fork, core.data_extent_count)
            .ok()
            .and_then(|extents| extents.into_iter().find(|e| e.file_block == 0))
            .and_then(|first| block(first.fs_block.0))
            .and_then(|data| dir_data_entries(&data).ok())
            .and_then(|entries| entries.into_iter().find(|e| e.name == b"..parent"))
            .map(|marker| marker.inode),
        _ => Some(root),
    };
    parent == Some(root)
}

/// Log records in the first blocks of `sb`'s log whose header verifies for its UUID and whose
/// LSN names the block they sit in.
fn placed_log_records(device: &dyn BlockDevice, sb: &Superblock) -> u32 {
    let g = sb.geometry;
    let count = u64::from(g.log_blocks).min(LOG_EVIDENCE_BLOCKS);
    let Some(raw) = read_len(
        device,
        g.byte_offset(FsBlock(g.log_start)),
        count * u64::from(g.block_size),
    ) else {
        return 0;
    };
    let sectors_per_block = u64::from(g.block_size) / 512;
    raw.chunks_exact(g.block_size as usize)
        .enumerate()
        .filter(|(index, block)| {
            let sector = &block[..LOG_RECORD_HEADER_BYTES.min(block.len())];
            LogRecordHeader::decode(sector).is_ok_and(|h| {
                h.uuid == sb.uuid()
                    && h.header_crc == log_header_crc(sector)
                    && u64::from(h.lsn.block()) == *index as u64 * sectors_per_block
            })
        })
        .count() as u32
}

/// A superblock as AG 0 would hold it, with what differs between copies cleared (header LSN
/// and CRC, and the counters the space phase recomputes).
fn normalized(sb: &Superblock) -> Superblock {
    let mut sb = sb.copy_for_ag(0);
    sb.header.crc = 0;
    sb.header.lsn = Lsn::ZERO;
    sb.free_blocks = 0;
    sb.inode_count = 0;
    sb.free_inodes = 0;
    sb
}

/// Every verified copy in AGs 1 and up, with its AG: where the primary's geometry puts them
/// and, when that finds none (the primary's own geometry may be the damage), where a copy
/// found by its claimed place or a scan puts them.
fn find_copies(
    device: &dyn BlockDevice,
    primary: &Result<Superblock, FormatError>,
) -> Vec<(u32, Superblock)> {
    let copies = primary
        .as_ref()
        .map(|sb| copies_where(device, sb))
        .unwrap_or_default();
    if !copies.is_empty() {
        return copies;
    }
    first_copy_by_claimed_geometry(device)
        .or_else(|| scan_for_copy(device))
        .map(|template| copies_where(device, &template))
        .unwrap_or_default()
}

/// The verified copies at the AG starts `template`'s geometry gives.
fn copies_where(device: &dyn BlockDevice, template: &Superblock) -> Vec<(u32, Superblock)> {
    let g = template.geometry;
    (1..g.ag_count)
        .filter_map(|ag| {
            let raw = read(device, g.byte_offset(FsBlock(g.ag_start(ag))), g.block_size)?;
            verify_copy(&raw, g.ag_start(ag)).filter(|sb| sb.header.owner == u64::from(ag))
        })
        .map(|sb| (sb.header.owner as u32, sb))
        .collect()
}

/// The copy in AG 1 where the primary's own (unverified) block and AG sizes put it.
fn first_copy_by_claimed_geometry(device: &dyn BlockDevice) -> Option<Superblock> {
    let head = read(device, 0, BLOCK_SIZE_MIN)?;
    let block_size = get_u32(&head, 52);
    let ag_blocks = get_u32(&head, 72);
    if !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&block_size) || !block_size.is_power_of_two() {
        return None;
    }
    let at = u64::from(ag_blocks) * u64::from(block_size);
    let raw = read(device, at, block_size)?;
    verify_copy(&raw, u64::from(ag_blocks))
}

/// The first verified copy of an AG other than 0, found by reading the device in pieces and
/// trying every `BLOCK_SIZE_MIN`-aligned place holding the superblock magic.
fn scan_for_copy(device: &dyn BlockDevice) -> Option<Superblock> {
    let total = device.size_bytes();
    let step = u64::from(BLOCK_SIZE_MIN);
    let mut offset = 0;
    while offset < total {
        let len = SCAN_BYTES.min(total - offset);
        let piece = read_len(device, offset, len)?;
        for (index, slot) in piece.chunks_exact(step as usize).enumerate() {
            let at = offset + index as u64 * step;
            if at == 0 || get_u32(slot, 0) != MetaKind::Superblock.magic() {
                continue;
            }
            let block_size = get_u32(slot, 52);
            if !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&block_size)
                || !block_size.is_power_of_two()
                || !at.is_multiple_of(u64::from(block_size))
            {
                continue;
            }
            let found = read(device, at, block_size)
                .and_then(|raw| verify_copy(&raw, at / u64::from(block_size)));
            if found.as_ref().is_some_and(|sb| sb.header.owner > 0) {
                return found;
            }
        }
        offset += len;
    }
    None
}

/// The superblock in `raw` if it verifies as the copy at block `blkno` (magic, CRC, block
/// number, its own UUID) and its owner is the AG that starts there.
fn verify_copy(raw: &[u8], blkno: u64) -> Option<Superblock> {
    let header = MetaHeader::decode(raw).ok()?;
    let expected = Expected {
        kind: MetaKind::Superblock,
        blkno,
        uuid: header.uuid,
        owner: Some(header.owner),
    };
    let sb = Superblock::read(raw, &expected).ok()?;
    (sb.geometry.ag_start(header.owner as u32) == blkno && header.owner < u64::from(u32::MAX))
        .then_some(sb)
}

/// Writes `winner` as the primary superblock (block 0); returns what was written.
fn write_primary(device: &dyn BlockDevice, winner: &Superblock) -> Result<Superblock, DeviceError> {
    let primary = winner.copy_for_ag(0);
    let block_size = primary.geometry.block_size as usize;
    // Whole sectors: a block may be smaller than the device's sector.
    let sector = device.logical_sector_size() as usize;
    let mut buf = AlignedBuf::zeroed(block_size.next_multiple_of(sector));
    device.read_at(0, &mut buf)?;
    buf[..block_size].fill(0);
    primary.encode(&mut buf[..block_size]);
    stamp(&mut buf[..block_size], None);
    device.write_at(0, &buf)?;
    device.flush()?;
    Ok(primary)
}

fn read(device: &dyn BlockDevice, at: u64, len: u32) -> Option<Vec<u8>> {
    read_len(device, at, u64::from(len))
}

/// `len` bytes at `at`, read in whole sectors; `None` if they cannot be read.
fn read_len(device: &dyn BlockDevice, at: u64, len: u64) -> Option<Vec<u8>> {
    let sector = u64::from(device.logical_sector_size());
    let start = at - at % sector;
    let end = (at + len).next_multiple_of(sector).min(device.size_bytes());
    if end <= at || end - at < len {
        return None;
    }
    let mut buf = AlignedBuf::zeroed((end - start) as usize);
    device.read_at(start, &mut buf).ok()?;
    let from = (at - start) as usize;
    Some(buf[from..from + len as usize].to_vec())
}
