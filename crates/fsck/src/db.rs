//! `cairn-db`: read-only views of a cairn filesystem for administrators (modelled on xfs_db):
//! the superblock, a free-space histogram, the file fragmentation factor, a file's extents
//! (shared ones marked), an inode, the log's records and the refcount trees. It reads
//! through `SnoopDevice`, so it is safe on a mounted device; what it shows of a live
//! filesystem is as of the last writeback.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cairn_blockdev::BlockDevice;
use cairn_format::btree_block::FreeSpaceRecord;
use cairn_format::inode::{FileType, ForkFormat, InodeCore, fork_extents, local_bytes};
use cairn_format::{AgNumber, Expected, Extent, InodeNumber, MetaKind, OnDisk, RefcountRecord};

use crate::check::Checker;
use crate::dir_read::DirSource;
use crate::snoop::SnoopDevice;
use crate::tree::AgTree;

/// Inspects a cairn filesystem (read-only; safe on a mounted device).
#[derive(Debug, Parser)]
#[command(name = "cairn-db", version, long_about = None)]
pub struct DbArgs {
    /// Block device or image file.
    pub device: PathBuf,
    #[command(subcommand)]
    pub command: DbCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DbCommand {
    /// The primary superblock.
    Sb,
    /// Free-extent histogram per AG and in total.
    Freesp,
    /// File fragmentation factor.
    Frag,
    /// A file's extents with AG and AG offset; blocks other files share are marked.
    Bmap { path_or_inode: String },
    /// The refcount tree records (reflink: shared and copy-on-write staging blocks) of one
    /// AG, or of every AG.
    Refcount { ag: Option<u32> },
    /// An inode's fields.
    Inode { number: u64 },
    /// The log's records and checkpoints.
    Logprint,
}

/// Why `cairn-db` could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    #[error(transparent)]
    Device(#[from] cairn_blockdev::DeviceError),
    #[error("{0}")]
    Format(#[from] cairn_format::FormatError),
    #[error("{0}")]
    NotFound(String),
}

/// Runs cairn-db with `args` (including the program name): 0, 8 on errors, 16 on usage.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match DbArgs::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 16 } else { 0 });
        }
    };
    let answer = SnoopDevice::open(&args.device)
        .map_err(DbError::from)
        .and_then(|device| run(&device, &args.command));
    match answer {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("cairn-db: {}: {err}", args.device.display());
            ExitCode::from(8)
        }
    }
}

/// Answers `command` about the filesystem on `device`.
pub fn run(device: &dyn BlockDevice, command: &DbCommand) -> Result<String, DbError> {
    let superblock = crate::probe::read_primary(device)??;
    let mut checker = Checker::new(device, superblock.clone());
    match command {
        DbCommand::Sb => Ok(format!("{superblock:#?}\n")),
        DbCommand::Freesp => Ok(freesp(&mut checker)),
        DbCommand::Frag => Ok(frag(&mut checker)),
        DbCommand::Bmap { path_or_inode } => {
            let number = resolve(&mut checker, path_or_inode)?;
            bmap(&mut checker, number)
        }
        DbCommand::Inode { number } => {
            let (core, _) = read_inode(&mut checker, *number)?;
            let block_size = u64::from(checker.geometry.block_size);
            let hint_bytes = u64::from(core.extent_size_hint) * block_size;
            let cow_hint_bytes = u64::from(core.cow_extent_size_hint) * block_size;
            Ok(format!(
                "inode {number}:\n{core:#?}\nflag names: [{}]\nextent size hint: {hint_bytes} \
                 bytes\nCoW extent size hint: {cow_hint_bytes} bytes\n",
                cairn_format::inode::flag_names(core.flags).join(", ")
            ))
        }
        DbCommand::Logprint => Ok(crate::logprint::logprint(&mut checker)),
        DbCommand::Refcount { ag } => refcount(&mut checker, *ag),
    }
}

/// The refcount records of AG `ag` (none without a tree; those that decode).
fn refcount_records(checker: &mut Checker<'_>, ag: u32) -> Vec<RefcountRecord> {
    let Some(agf) = checker.read_agf(ag).filter(|agf| agf.has_refcount_tree()) else {
        return Vec::new();
    };
    let tree = AgTree {
        kind: MetaKind::RefcountBtree,
        ag,
        root: agf.refcount_root,
        levels: agf.refcount_levels,
    };
    let raw = checker.walk_ag_tree(tree).unwrap_or_default();
    raw.iter()
        .filter_map(|bytes| RefcountRecord::decode(bytes).ok())
        .collect()
}

fn refcount(checker: &mut Checker<'_>, only: Option<u32>) -> Result<String, DbError> {
    let count = checker.geometry.ag_count;
    if only.is_some_and(|ag| ag >= count) {
        return Err(DbError::NotFound(format!(
            "no AG {} (of {count})",
            only.unwrap_or(0)
        )));
    }
    let mut out = String::new();
    let (mut shared, mut staging) = (0u64, 0u64);
    for ag in (0..count).filter(|ag| only.is_none_or(|only| only == *ag)) {
        let records = refcount_records(checker, ag);
        let _ = writeln!(out, "AG {ag}: {} records", records.len());
        let base = checker.geometry.ag_start(ag);
        for record in records {
            let start = base + u64::from(record.start.0);
            let end = start + u64::from(record.length) - 1;
            let (first, last) = (record.start.0, record.end() - 1);
            match record.staging {
                true => staging += u64::from(record.length),
                false => shared += u64::from(record.length),
            }
            let what = match record.staging {
                true => "copy-on-write staging".to_string(),
                false => format!("shared by {}", record.refcount),
            };
            let length = record.length;
            let _ = writeln!(
                out,
                "  {start}..{end} ({first}..{last}) {length} blocks {what}"
            );
        }
    }
    let _ = writeln!(out, "shared blocks {shared}, staging blocks {staging}");
    Ok(out)
}

/// Free extents of AG `ag` from its by-block tree.
fn free_extents(checker: &mut Checker<'_>, ag: u32) -> Vec<FreeSpaceRecord> {
    let Some(agf) = checker.read_agf(ag) else {
        return Vec::new();
    };
    let tree = AgTree {
        kind: MetaKind::BnoBtree,
        ag,
        root: agf.bno_root,
        levels: agf.bno_levels,
    };
    let raw = checker.walk_ag_tree(tree).unwrap_or_default();
    raw.iter()
        .filter_map(|bytes| FreeSpaceRecord::decode(bytes).ok())
        .collect()
}

/// The `from to extents blocks pct` table of power-of-two buckets.
fn histogram(lengths: &[u32]) -> String {
    let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
    let mut buckets = [(0u64, 0u64); 33];
    for &length in lengths {
        let bucket = (31 - length.max(1).leading_zeros()) as usize;
        buckets[bucket].0 += 1;
        buckets[bucket].1 += u64::from(length);
    }
    let mut out = format!(
        "{:>10} {:>10} {:>10} {:>12} {:>7}\n",
        "from", "to", "extents", "blocks", "pct"
    );
    for (bucket, &(extents, blocks)) in buckets.iter().enumerate().filter(|(_, b)| b.0 > 0) {
        let from = 1u64 << bucket;
        let pct = blocks as f64 * 100.0 / total.max(1) as f64;
        let _ = writeln!(
            out,
            "{from:>10} {:>10} {extents:>10} {blocks:>12} {pct:>7.2}",
            2 * from - 1
        );
    }
    let _ = writeln!(
        out,
        "total free extents {}, total free blocks {total}",
        lengths.len()
    );
    out
}

fn freesp(checker: &mut Checker<'_>) -> String {
    let mut out = String::new();
    let mut all = Vec::new();
    for ag in 0..checker.geometry.ag_count {
        let lengths: Vec<u32> = free_extents(checker, ag).iter().map(|r| r.length).collect();
        let _ = write!(out, "AG {ag}:\n{}", histogram(&lengths));
        all.extend(lengths);
    }
    let _ = write!(out, "all AGs:\n{}", histogram(&all));
    out
}

fn frag(checker: &mut Checker<'_>) -> String {
    checker.scan_ags();
    let actual: u64 = checker.file_extent_counts.iter().map(|&(_, c)| c).sum();
    let ideal = checker.file_extent_counts.len() as u64;
    let factor = (actual - ideal) as f64 * 100.0 / actual.max(1) as f64;
    format!("actual {actual}, ideal {ideal}, fragmentation factor {factor:.2}%\n")
}

/// Reads inode `number`'s core and raw bytes.
fn read_inode(checker: &mut Checker<'_>, number: u64) -> Result<(InodeCore, Vec<u8>), DbError> {
    let not_found = || DbError::NotFound(format!("{number} is not an inode of this filesystem"));
    let (at, offset) = checker
        .geometry
        .inode_position(InodeNumber(number))
        .ok_or_else(not_found)?;
    let block = checker
        .read_block(at, MetaKind::Inode.name())
        .ok_or_else(not_found)?;
    let raw = block[offset..offset + checker.geometry.inode_size as usize].to_vec();
    let expected = Expected {
        kind: MetaKind::Inode,
        blkno: number,
        uuid: checker.uuid,
        owner: Some(number),
    };
    Ok((InodeCore::read(&raw, &expected)?, raw))
}

/// The data fork extents of an inode (inline list or tree).
fn data_extents(checker: &mut Checker<'_>, number: u64) -> Result<Vec<Extent>, DbError> {
    let (core, raw) = read_inode(checker, number)?;
    let fork = &raw[core.data_fork_range(checker.geometry.inode_size)];
    match core.data_format {
        ForkFormat::Extents => Ok(fork_extents(fork, core.data_extent_count)?),
        ForkFormat::Btree => checker
            .walk_bmap_tree(InodeNumber(number), fork, &core)
            .map(|found| found.extents)
            .ok_or_else(|| DbError::NotFound(format!("inode {number}: unreadable extent tree"))),
        ForkFormat::Local | ForkFormat::Device => Ok(Vec::new()),
    }
}

/// An inode number, or a path from the root resolved through the directories.
fn resolve(checker: &mut Checker<'_>, target: &str) -> Result<u64, DbError> {
    if let Ok(number) = target.parse::<u64>() {
        return Ok(number);
    }
    let mut current = checker.superblock.root_inode;
    for name in target.split('/').filter(|n| !n.is_empty()) {
        let (core, raw) = read_inode(checker, current)?;
        if core.file_type() != Some(FileType::Directory) {
            return Err(DbError::NotFound(format!(
                "{target}: inode {current} is no directory"
            )));
        }
        let source = if core.data_format == ForkFormat::Local {
            let fork = &raw[core.data_fork_range(checker.geometry.inode_size)];
            DirSource::Short(local_bytes(fork, core.size)?.to_vec())
        } else {
            DirSource::Blocks(data_extents(checker, current)?)
        };
        let listing = checker.read_directory(current, &source);
        let found = listing.and_then(|l| l.entries.into_iter().find(|e| e.name == name.as_bytes()));
        current = found
            .ok_or_else(|| DbError::NotFound(format!("{target}: no entry '{name}'")))?
            .inode;
    }
    Ok(current)
}

fn bmap(checker: &mut Checker<'_>, number: u64) -> Result<String, DbError> {
    let extents = data_extents(checker, number)?;
    let mut out = format!("inode {number}: {} extents\n", extents.len());
    let g = checker.geometry;
    let mut records: std::collections::BTreeMap<u32, Vec<RefcountRecord>> = Default::default();
    for (index, extent) in extents.iter().enumerate() {
        let ag = g.ag_of(extent.fs_block);
        let offset = extent.fs_block.0 - g.ag_start(AgNumber(ag.0).0);
        let ag_records = records
            .entry(ag.0)
            .or_insert_with(|| refcount_records(checker, ag.0));
        let shared = shared_note(ag_records, offset, extent.length);
        let state = if extent.unwritten { " unwritten" } else { "" };
        let state = format!("{state}{shared}");
        let _ = writeln!(
            out,
            "{index}: [{}..{}]: {}..{} AG {} ({offset}..{}) {} blocks{state}",
            extent.file_block,
            extent.file_end() - 1,
            extent.fs_block.0,
            extent.fs_end().0 - 1,
            ag.0,
            offset + u64::from(extent.length) - 1,
            extent.length
        );
    }
    Ok(out)
}

/// " shared: a..b xN, ..." for the parts of AG blocks `offset..offset + length` that other
/// files share (the refcount records of the AG), or nothing.
fn shared_note(records: &[RefcountRecord], offset: u64, length: u32) -> String {
    let end = offset + u64::from(length);
    let parts: Vec<String> = records
        .iter()
        .filter(|r| !r.staging && r.end() > offset && u64::from(r.start.0) < end)
        .map(|r| {
            let from = u64::from(r.start.0).max(offset);
            let to = r.end().min(end);
            format!("{from}..{} x{}", to - 1, r.refcount)
        })
        .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!(" shared: {}", parts.join(", ")),
    }
}
