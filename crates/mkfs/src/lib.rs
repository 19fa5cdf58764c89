//! mkfs.cairn: lays a fresh cairn filesystem onto a device or image file.
//!
//! Owns: choosing the geometry (`plan`), recognising what a device already holds
//! (`signature`), building every initial metadata block (`build`) and writing them (`format`).
//! Invariants:
//! - every block mkfs writes is built with the format crate's codecs and stamped with its CRC,
//!   exactly as the daemon would write it;
//! - per AG: the free-space trees, the AGF counters and the AGFL describe the same free blocks,
//!   and every block of the AG is exactly one of header, free list, tree root, inode chunk, log
//!   or free;
//! - nothing is written until the plan is valid, and the device is flushed before success.

pub mod build;
pub mod cli;
mod inodes;
pub mod plan;
pub mod signature;
pub mod size;

use std::time::{Duration, Instant};

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};
use cairn_format::Superblock;

pub use plan::{Plan, Request, plan};

/// Why mkfs failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MkfsError {
    #[error(transparent)]
    Device(#[from] DeviceError),

    #[error("invalid option: {0}")]
    Option(String),

    #[error("the device is {bytes} bytes; a cairn filesystem needs at least {needed} bytes")]
    TooSmall { bytes: u64, needed: u64 },

    #[error("cannot build this geometry: {field} = {value}: {why}")]
    Geometry {
        field: &'static str,
        value: u64,
        why: &'static str,
    },

    #[error("{path} holds {found}; use -f to overwrite it")]
    Existing { path: String, found: String },

    #[error("{path}: {message}")]
    Path { path: String, message: String },
}

/// What `format` did, for the summary line.
#[derive(Debug, Clone)]
pub struct FormatReport {
    pub superblock: Superblock,
    pub metadata_blocks: u64,
    pub elapsed: Duration,
}

/// Options of one format run beyond the geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatOptions {
    /// Filesystem UUID; random when `None`.
    pub uuid: Option<[u8; 16]>,
    /// Discard the whole filesystem range first (frees an image file's old blocks).
    pub discard: bool,
    /// Creation time stamped on the root directory and the superblock.
    pub now_secs: i64,
}

/// Writes a new filesystem laid out by `plan` onto `device`, then flushes it.
pub fn format(
    device: &dyn BlockDevice,
    plan: &Plan,
    options: &FormatOptions,
) -> Result<FormatReport, MkfsError> {
    let started = Instant::now();
    let g = &plan.geometry;
    let fs_bytes = g.block_count * u64::from(g.block_size);
    if options.discard {
        // A failed or unsupported discard only costs space, never correctness.
        let _ = device.discard(0, fs_bytes);
    }
    let uuid = options
        .uuid
        .unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let image = build::build(plan, uuid, options.now_secs)?;
    for run in &image.runs {
        device.write_at(g.byte_offset(run.start), &run.data)?;
    }
    device.write_zeroes(
        g.byte_offset(cairn_format::FsBlock(g.log_start)),
        log_bytes(plan),
    )?;
    device.flush()?;
    Ok(FormatReport {
        superblock: image.superblock,
        metadata_blocks: image.metadata_blocks,
        elapsed: started.elapsed(),
    })
}

fn log_bytes(plan: &Plan) -> u64 {
    u64::from(plan.geometry.log_blocks) * u64::from(plan.geometry.block_size)
}

/// Reads the first `len` bytes of the device (rounded to whole sectors, clipped to its size).
pub fn read_head(device: &dyn BlockDevice, len: u64) -> Result<AlignedBuf, DeviceError> {
    let sector = u64::from(device.logical_sector_size());
    let len = len.min(device.size_bytes()) / sector * sector;
    let mut head = AlignedBuf::zeroed(len as usize);
    device.read_at(0, &mut head)?;
    Ok(head)
}
