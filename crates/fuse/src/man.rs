//! Man pages for every cairn binary, generated from their clap definitions, so they never
//! drift from `--help`. `cairn man DIR` writes them (the tree keeps them in `docs/man`).

use std::io;
use std::path::Path;

use clap::CommandFactory;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, roman};

use crate::options::OPTION_HELP;

/// One page: file name and the rendered roff text.
fn render(command: clap::Command, extra: Option<Roff>) -> io::Result<Vec<u8>> {
    // clap_mangen's version section needs a version (subcommands have none of their own).
    let has_version = command.get_version().is_some();
    let man = Man::new(command).section("8").manual("cairn");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    man.render_subcommands_section(&mut out)?;
    if let Some(extra) = extra {
        extra.to_writer(&mut out)?;
    }
    if has_version {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// The MOUNT OPTIONS section of cairn(8).
fn mount_options_section() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["MOUNT OPTIONS"]);
    for (name, meaning) in OPTION_HELP {
        roff.control("TP", []);
        roff.text([bold(*name)]);
        roff.text([roman(*meaning)]);
    }
    roff.control("SH", ["STATISTICS"]);
    roff.text([roman(
        "cairn stats MOUNTPOINT prints the counters of every subsystem and of FUSE \
         requests by type; --json and --format openmetrics print the same counters for \
         monitoring agents, under stable names in base units (the user guide lists them). \
         They are read as the extended attributes system.cairn.stats, \
         system.cairn.stats.json and system.cairn.stats.openmetrics of the mount's root, \
         so any user who can see the mount can read them.",
    )]);
    roff.control("SH", ["FILE ATTRIBUTES"]);
    roff.text([roman(
        "stat reports the birth time (statx, Linux 6.6 and later). chattr and lsattr set \
         and show the immutable (i), append-only (a), sync (S), no-atime (A) and no-dump \
         (d) flags and, on directories, project inheritance (P); FS_IOC_FSSETXATTR sets \
         extent size hints and project ids (cairn extsize PATH --set SIZE). The daemon \
         enforces the flags as XFS does: an immutable file takes no new writer, truncate, \
         attribute, name or extended attribute change; an append-only file only appends.",
    )]);
    roff.control("SH", ["DURABILITY"]);
    roff.text([roman(
        "fsync and fdatasync make a file durable when they return. The kernel does not \
         pass sync(2) or syncfs(2) on to a FUSE daemon, so cairn keeps its own promise: \
         whatever the daemon received longer ago than the commit window (-o commit=, 5 \
         seconds by default) is durable without an fsync, and cairn sync PATH makes \
         everything written so far durable at once (it calls syncfs first, which hands the \
         kernel's cached pages to the daemon). A crash shows a file that was not fsynced \
         shorter than written or absent, never with bytes nobody wrote; a file replaced by \
         rename shows its old content or its new one.",
    )]);
    roff.control("SH", ["UNMOUNTING"]);
    roff.text([roman(
        "As root, cairn mounts as fuseblk over a loop device it attaches itself, so the \
         kernel waits for the daemon at unmount: when umount or fusermount3 -u returns, \
         every change is on stable storage, the log is clean and the device released. \
         Plain fuse mounts (other users, -o noblkdev, fsname=) return before the daemon \
         has written back.",
    )]);
    roff
}

/// Subcommands of cairn and the names of their pages.
const SUBCOMMAND_PAGES: [(&str, &str); 6] = [
    ("stats", "cairn-stats"),
    ("sync", "cairn-sync"),
    ("trim", "cairn-trim"),
    ("grow", "cairn-grow"),
    ("extsize", "cairn-extsize"),
    ("man", "cairn-man"),
];

/// The pages: (file name, text). Each subcommand of cairn gets a page of its own
/// (`cairn-stats.8`), as the SUBCOMMANDS section of cairn(8) refers to them.
pub fn pages() -> io::Result<Vec<(String, Vec<u8>)>> {
    let command = crate::cli::Args::command();
    let mut pages = Vec::new();
    for sub in command.get_subcommands() {
        let Some((_, name)) = SUBCOMMAND_PAGES.iter().find(|(n, _)| *n == sub.get_name()) else {
            return Err(io::Error::other(format!(
                "no page name for '{}'",
                sub.get_name()
            )));
        };
        let sub = sub.clone().name(*name).version(env!("CARGO_PKG_VERSION"));
        let page = render(sub, None)?;
        pages.push((format!("{name}.8"), page));
    }
    pages.push((
        "cairn.8".to_string(),
        render(command, Some(mount_options_section()))?,
    ));
    pages.push((
        "mkfs.cairn.8".to_string(),
        render(cairn_mkfs::cli::Args::command(), None)?,
    ));
    pages.push((
        "fsck.cairn.8".to_string(),
        render(cairn_fsck::cli::Args::command(), None)?,
    ));
    pages.push((
        "cairn-db.8".to_string(),
        render(cairn_fsck::db::DbArgs::command(), None)?,
    ));
    Ok(pages)
}

/// Writes every page into `dir`; returns the file names written.
pub fn write_all(dir: &Path) -> io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (name, text) in pages()? {
        std::fs::write(dir.join(&name), text)?;
        written.push(name);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each page names its program and its options; cairn's lists the mount options.
    #[test]
    fn pages_describe_each_binary() {
        let pages = pages().unwrap();
        let text = |name: &str| {
            let page = pages.iter().find(|(n, _)| *n == name).unwrap();
            String::from_utf8(page.1.clone()).unwrap()
        };
        let cairn = text("cairn.8");
        assert!(cairn.contains("MOUNT OPTIONS"));
        assert!(cairn.contains("logmode"));
        assert!(cairn.contains("stats"));
        assert!(text("mkfs.cairn.8").contains("block\\-size"));
        assert!(text("fsck.cairn.8").contains("no\\-modify"));
        assert!(text("cairn-stats.8").contains("MOUNTPOINT"));
        assert!(text("cairn-stats.8").contains("openmetrics"));
        assert!(text("cairn-extsize.8").contains("SIZE"));
        assert!(cairn.contains("FILE ATTRIBUTES"));
        let db = text("cairn-db.8");
        assert!(db.contains("freesp") && db.contains("logprint"), "{db}");
    }
}
