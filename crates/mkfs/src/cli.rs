//! The `mkfs.cairn` command line.
//!
//! Exit status: 0 formatted (or, with `-n`, planned); 1 the device could not be formatted
//! (the message says why); 2 the command line was wrong.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cairn_blockdev::{BlockDevice, FileDevice, OpenOptions};
use clap::Parser;

use crate::plan::{Plan, Request, plan};
use crate::signature::{PROBE_BYTES, identify};
use crate::size::{human_size, parse_size};
use crate::{FormatOptions, MkfsError, format, read_head};

/// Format a device or image file with a cairn filesystem.
#[derive(Debug, Parser)]
#[command(name = "mkfs.cairn", version, about, long_about = None)]
pub struct Args {
    /// Block device or image file to format.
    pub device: PathBuf,
    /// Filesystem block size (512 to 64K, a power of two).
    #[arg(short = 'b', long, value_parser = parse_u32_size, default_value = "4096")]
    pub block_size: u32,
    /// Sector size to assume (image files default to 4096; 512 allows 512-byte blocks).
    #[arg(long, value_parser = parse_u32_size)]
    pub sector_size: Option<u32>,
    /// Inode size (256 to 2048, a power of two; default 512).
    #[arg(short = 'i', long, value_parser = parse_u32_size)]
    pub inode_size: Option<u32>,
    /// Number of allocation groups.
    #[arg(short = 'a', long, conflicts_with = "ag_size")]
    pub ag_count: Option<u32>,
    /// Size of each allocation group.
    #[arg(short = 'A', long, value_parser = parse_size)]
    pub ag_size: Option<u64>,
    /// Size of the internal log.
    #[arg(short = 'l', long, value_parser = parse_size)]
    pub log_size: Option<u64>,
    /// Filesystem label (up to 32 bytes).
    #[arg(short = 'L', long, default_value = "")]
    pub label: String,
    /// Filesystem size: creates or grows an image file to it; on a device, formats only that much.
    #[arg(short = 's', long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Overwrite an existing filesystem or partition table.
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Print the geometry and write nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Print nothing but errors.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Do not discard the device's old contents first.
    #[arg(long)]
    pub no_discard: bool,
    /// Use this UUID instead of a random one.
    #[arg(short = 'U', long, value_parser = parse_uuid)]
    pub uuid: Option<[u8; 16]>,
    /// Open the device without O_DIRECT (for filesystems such as tmpfs that refuse it).
    #[arg(long)]
    pub buffered: bool,
    /// Make a filesystem whose files never share blocks (no reflink feature): copies are
    /// full copies, and cairn releases from before reflink can mount it.
    #[arg(long)]
    pub no_reflink: bool,
}

fn parse_u32_size(text: &str) -> Result<u32, String> {
    let value = parse_size(text)?;
    u32::try_from(value).map_err(|_| format!("'{text}' is too large"))
}

fn parse_uuid(text: &str) -> Result<[u8; 16], String> {
    uuid::Uuid::parse_str(text)
        .map(|u| *u.as_bytes())
        .map_err(|e| format!("'{text}': {e}"))
}

/// Runs mkfs.cairn with `args` (including the program name) and returns its exit status.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            // clap prints help and version to stdout (exit 0) and usage errors to stderr (2).
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 2 } else { 0 });
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mkfs.cairn: {err}");
            ExitCode::from(1)
        }
    }
}

/// Formats (or with `-n`, only plans) as `args` say.
pub fn run(args: &Args) -> Result<(), MkfsError> {
    let device = open_device(args)?;
    let head = read_head(&device, PROBE_BYTES as u64)?;
    let found = identify(&head);
    if let Some(found) = &found
        && !args.force
        && !args.dry_run
    {
        let path = args.device.display().to_string();
        return Err(MkfsError::Existing {
            path,
            found: found.clone(),
        });
    }
    let request = Request {
        block_size: args.block_size,
        sector_size: args.sector_size,
        inode_size: args.inode_size,
        ag_count: args.ag_count,
        ag_bytes: args.ag_size,
        log_bytes: args.log_size,
        fs_bytes: args.size.map(|size| size.min(device.size_bytes())),
        label: args.label.clone(),
        reflink: !args.no_reflink,
    };
    let plan = plan(device.size_bytes(), device.logical_sector_size(), &request)?;
    if args.dry_run {
        if let Some(found) = found {
            println!("{} holds {found}; -n writes nothing", args.device.display());
        }
        print_geometry(&args.device, &plan, None);
        return Ok(());
    }
    let options = FormatOptions {
        uuid: args.uuid,
        discard: !args.no_discard,
        now_secs: now_secs(),
    };
    let report = format(&device, &plan, &options)?;
    if !args.quiet {
        print_geometry(&args.device, &plan, Some(report.superblock.uuid()));
        println!(
            "wrote {} metadata blocks in {:.3} s",
            report.metadata_blocks,
            report.elapsed.as_secs_f64()
        );
    }
    Ok(())
}

fn open_device(args: &Args) -> Result<FileDevice, MkfsError> {
    let path = &args.device;
    let exists = path.exists();
    if !exists && (args.size.is_none() || args.dry_run) {
        return Err(MkfsError::Path {
            path: path.display().to_string(),
            message: "does not exist (give -s SIZE to create an image file)".into(),
        });
    }
    let grow = args
        .size
        .filter(|_| !args.dry_run && wants_growth(path, args.size));
    let options = OpenOptions {
        read_only: args.dry_run,
        direct: !args.buffered,
        sector_size: args.sector_size,
        create_size: grow,
    };
    Ok(FileDevice::open(path, &options)?)
}

/// An image file is created or grown to `-s`, never shrunk; devices are never resized.
fn wants_growth(path: &Path, size: Option<u64>) -> bool {
    match (std::fs::metadata(path), size) {
        (Err(_), Some(_)) => true,
        (Ok(meta), Some(size)) => meta.is_file() && meta.len() < size,
        _ => false,
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn print_geometry(path: &Path, plan: &Plan, uuid: Option<[u8; 16]>) {
    let g = &plan.geometry;
    let bytes = g.block_count * u64::from(g.block_size);
    let uuid = uuid.map(|u| uuid::Uuid::from_bytes(u).to_string());
    println!(
        "meta-data={:<22} agcount={}, agsize={} blks",
        path.display(),
        g.ag_count,
        g.ag_blocks
    );
    let reflink = plan.features_incompat & cairn_format::superblock::FEATURE_INCOMPAT_REFLINK;
    println!(
        "         ={:<22} sectsz={}, isize={}, reflink={}",
        "",
        g.sector_size,
        g.inode_size,
        u8::from(reflink != 0)
    );
    println!(
        "data     ={:<22} bsize={}, blocks={} ({})",
        "",
        g.block_size,
        g.block_count,
        human_size(bytes)
    );
    println!(
        "log      =internal log           bsize={}, blocks={}, start={} (AG {})",
        g.block_size, g.log_blocks, g.log_start, plan.log_ag
    );
    let label = String::from_utf8_lossy(&plan.label)
        .trim_end_matches('\0')
        .to_string();
    println!(
        "naming   =version 1              label='{label}', uuid={}",
        uuid.as_deref().unwrap_or("(chosen when written)")
    );
    println!("root     =inode {}", plan.root_inode.0);
}
