//! The first inode chunk: the root directory in slot 0, every other inode free.

use cairn_blockdev::AlignedBuf;
use cairn_format::inode::{ForkFormat, Timestamp, free_inode_core};
use cairn_format::limits::INODES_PER_CHUNK;
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{AgNumber, Lsn, MetaHeader, MetaKind, OnDisk, stamp};

use crate::MkfsError;
use crate::build::BlockRun;
use crate::plan::Plan;

/// File type and permission bits of the root directory: `drwxr-xr-x`.
const ROOT_MODE: u16 = 0o040_755;

/// Builds the chunk holding the root directory.
pub fn root_chunk(plan: &Plan, uuid: [u8; 16], now_secs: i64) -> Result<BlockRun, MkfsError> {
    let g = &plan.geometry;
    let inode_size = g.inode_size as usize;
    let mut chunk = AlignedBuf::zeroed(g.chunk_blocks() as usize * g.block_size as usize);
    // Generations start from a random value so inode numbers reused across mkfs runs of the
    // same image do not repeat (NFS-style handles stay distinguishable).
    let seed = u32::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..4]
            .try_into()
            .unwrap_or([0; 4]),
    );
    for slot in 0..INODES_PER_CHUNK {
        let number = g.inode_number(AgNumber(0), plan.root_chunk, 0).0 + u64::from(slot);
        let raw = &mut chunk[slot as usize * inode_size..(slot as usize + 1) * inode_size];
        let header = MetaHeader::new(MetaKind::Inode, number, uuid, number);
        let generation = seed.wrapping_add(slot);
        if slot == 0 {
            root_directory(header, generation, now_secs, raw)?;
        } else {
            free_inode_core(header, generation).encode(raw);
        }
        stamp(raw, Some(Lsn::ZERO));
    }
    Ok(BlockRun {
        start: g.fs_block(AgNumber(0), plan.root_chunk),
        data: chunk,
    })
}

/// The root directory: empty, its own parent, owned by whoever runs mkfs (so an image made by
/// a user can be mounted and used by that user).
fn root_directory(
    header: MetaHeader,
    generation: u32,
    now_secs: i64,
    raw: &mut [u8],
) -> Result<(), MkfsError> {
    let dir = cairn_format::dir::ShortformDir {
        parent: header.blkno,
        entries: Vec::new(),
    };
    let body = dir.encode().map_err(|e| MkfsError::Option(e.to_string()))?;
    let now = Timestamp {
        seconds: now_secs,
        nanoseconds: 0,
    };
    let mut core = free_inode_core(header, generation);
    core.mode = ROOT_MODE;
    core.data_format = ForkFormat::Local;
    core.nlink = 2;
    core.uid = current_uid();
    core.gid = current_gid();
    core.size = body.len() as u64;
    core.atime = now;
    core.mtime = now;
    core.ctime = now;
    core.btime = now;
    core.next_unlinked = NULL_AG_INODE;
    core.encode(raw);
    let fork = core.data_fork_range(raw.len() as u32);
    if body.len() > fork.len() {
        return Err(MkfsError::Option(
            "the root directory does not fit in the inode".into(),
        ));
    }
    raw[fork.start..fork.start + body.len()].copy_from_slice(&body);
    core.check(raw.len() as u32)
        .map_err(|e| MkfsError::Option(e.to_string()))?;
    Ok(())
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn current_gid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}
