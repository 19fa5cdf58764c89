//! Walks a mounted filesystem: every directory by readdir, every inode by getattr, every file
//! read to its end, every symlink read. The result is what the oracle compares to the model.

use std::collections::{BTreeMap, BTreeSet};

use cairn_fs::{Credentials, FileKind, Filesystem, FsError};

use crate::model::{Path, Xattrs, join};

/// Deepest directory nesting walked; deeper means a cycle or a damaged tree.
pub const WALK_DEPTH_MAX: usize = 64;
/// Most entries walked in one filesystem, so a damaged directory cannot make the walk endless.
pub const WALK_ENTRIES_MAX: usize = 100_000;
/// Entries asked of readdir at once.
const READDIR_BATCH: usize = 64;
/// Bytes asked of read at once.
const READ_CHUNK_BYTES: u32 = 1 << 20;

/// One name found by the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub inode: u64,
    pub kind: FileKind,
    pub nlink: u32,
    pub size: u64,
    /// Device number of a device node.
    pub rdev: u32,
    /// File contents, read up to the walk's limit.
    pub content: Vec<u8>,
    /// Symlink target.
    pub target: Vec<u8>,
    /// Extended attributes (files and directories), full name to value.
    pub xattrs: Xattrs,
}

/// Everything the walk found, by full path (the root is not listed).
#[derive(Debug, Clone, Default)]
pub struct Tree {
    pub entries: BTreeMap<Path, Seen>,
    pub root_nlink: u32,
}

/// Why a walk stopped: an error from the filesystem or an inconsistency it saw.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{what} of {path:?}: {source}")]
    Fs {
        what: &'static str,
        path: Path,
        source: FsError,
    },
    #[error("{path:?}: {detail}")]
    Inconsistent { path: Path, detail: String },
}

fn fs_error(what: &'static str, path: &str) -> impl FnOnce(FsError) -> WalkError {
    let path = path.to_string();
    move |source| WalkError::Fs { what, path, source }
}

fn inconsistent(path: &str, detail: String) -> WalkError {
    WalkError::Inconsistent {
        path: path.to_string(),
        detail,
    }
}

/// Walks the whole tree of `fs`, reading at most `read_max_bytes` of each file. A name that
/// is not UTF-8 is an inconsistency (no workload makes one).
pub fn walk(fs: &Filesystem, read_max_bytes: u64) -> Result<Tree, WalkError> {
    walk_names(fs, read_max_bytes, false)
}

/// `walk`, but names that are not UTF-8 (which cairn allows: a repaired entry may have any
/// bytes but '/' and NUL) are taken with their other bytes written `\xNN`, and an attribute
/// listed but of a namespace cairn-fs does not serve (`Unsupported`) is taken as empty.
pub fn walk_any_names(fs: &Filesystem, read_max_bytes: u64) -> Result<Tree, WalkError> {
    walk_names(fs, read_max_bytes, true)
}

fn walk_names(fs: &Filesystem, read_max_bytes: u64, lenient: bool) -> Result<Tree, WalkError> {
    let root = fs.getattr(fs.root()).map_err(fs_error("getattr", ""))?;
    let mut tree = Tree {
        root_nlink: root.nlink,
        ..Tree::default()
    };
    let mut visited = BTreeSet::from([fs.root()]);
    let mut pending = vec![(String::new(), fs.root(), 0usize)];
    while let Some((path, dir, depth)) = pending.pop() {
        if depth > WALK_DEPTH_MAX {
            return Err(inconsistent(&path, "directories nested too deep".into()));
        }
        for (name, inode, kind) in list_dir(fs, &path, dir, lenient)? {
            let child = join(&path, &name);
            let seen = examine(fs, &child, (inode, kind), read_max_bytes, lenient)?;
            if seen.kind == FileKind::Directory {
                if !visited.insert(inode) {
                    return Err(inconsistent(
                        &child,
                        format!("directory {inode} seen twice"),
                    ));
                }
                pending.push((child.clone(), inode, depth + 1));
            }
            tree.entries.insert(child, seen);
            if tree.entries.len() > WALK_ENTRIES_MAX {
                return Err(inconsistent(&path, "too many entries".into()));
            }
        }
    }
    Ok(tree)
}

/// The entries of directory `dir` other than "." and "..", checking that cookies advance.
fn list_dir(
    fs: &Filesystem,
    path: &str,
    dir: u64,
    lenient: bool,
) -> Result<Vec<(String, u64, FileKind)>, WalkError> {
    let mut found = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs
            .readdir(dir, cookie, READDIR_BATCH)
            .map_err(fs_error("readdir", path))?;
        let Some(last) = batch.last() else { break };
        if last.cookie <= cookie && cookie != 0 {
            return Err(inconsistent(
                path,
                format!("readdir cookie {cookie} repeats"),
            ));
        }
        cookie = last.cookie;
        for entry in batch {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let name = match String::from_utf8(entry.name.clone()) {
                Ok(name) => name,
                Err(_) if lenient => escaped(&entry.name),
                Err(_) => {
                    let detail = format!("name {:?} not UTF-8", entry.name);
                    return Err(inconsistent(path, detail));
                }
            };
            found.push((name, entry.inode, entry.kind));
        }
        if found.len() > WALK_ENTRIES_MAX {
            return Err(inconsistent(path, "directory never ends".into()));
        }
    }
    Ok(found)
}

/// `name` with every byte outside printable ASCII (and the backslash) written `\xNN`.
fn escaped(name: &[u8]) -> String {
    name.iter()
        .map(|&b| match b {
            b'\\' => "\\x5c".to_string(),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}

/// Reads the attributes, and the contents or target, of one named inode.
fn examine(
    fs: &Filesystem,
    path: &str,
    (inode, listed): (u64, FileKind),
    read_max_bytes: u64,
    lenient: bool,
) -> Result<Seen, WalkError> {
    let attr = fs.getattr(inode).map_err(fs_error("getattr", path))?;
    if attr.kind != listed {
        let detail = format!("readdir says {listed:?}, inode says {:?}", attr.kind);
        return Err(inconsistent(path, detail));
    }
    let mut seen = Seen {
        inode,
        kind: attr.kind,
        nlink: attr.nlink,
        size: attr.size,
        rdev: attr.rdev,
        content: Vec::new(),
        target: Vec::new(),
        xattrs: Xattrs::new(),
    };
    if matches!(attr.kind, FileKind::Regular | FileKind::Directory) {
        seen.xattrs = read_xattrs(fs, path, inode, lenient)?;
    }
    match attr.kind {
        FileKind::Regular => seen.content = read_all(fs, path, inode, attr.size, read_max_bytes)?,
        FileKind::Symlink => {
            seen.target = fs.readlink(inode).map_err(fs_error("readlink", path))?
        }
        _ => {}
    }
    Ok(seen)
}

/// Every extended attribute of `inode`, as root sees them (`lenient`: one of a namespace
/// cairn-fs does not serve reads as empty).
fn read_xattrs(
    fs: &Filesystem,
    path: &str,
    inode: u64,
    lenient: bool,
) -> Result<Xattrs, WalkError> {
    let who = Credentials::root();
    let mut xattrs = Xattrs::new();
    for name in fs
        .listxattr(inode, &who)
        .map_err(fs_error("listxattr", path))?
    {
        let value = match fs.getxattr(inode, &name, &who) {
            Err(FsError::Unsupported) if lenient => Vec::new(),
            other => other.map_err(fs_error("getxattr", path))?,
        };
        if xattrs.insert(name.clone(), value).is_some() {
            let detail = format!(
                "attribute {:?} listed twice",
                String::from_utf8_lossy(&name)
            );
            return Err(inconsistent(path, detail));
        }
    }
    Ok(xattrs)
}

fn read_all(
    fs: &Filesystem,
    path: &str,
    inode: u64,
    size: u64,
    read_max_bytes: u64,
) -> Result<Vec<u8>, WalkError> {
    let want = size.min(read_max_bytes);
    let mut content = Vec::new();
    while (content.len() as u64) < want {
        let chunk = (want - content.len() as u64).min(u64::from(READ_CHUNK_BYTES)) as u32;
        let data = fs
            .read(inode, content.len() as u64, chunk)
            .map_err(fs_error("read", path))?;
        if data.is_empty() {
            let detail = format!("read stops at {} of size {size}", content.len());
            return Err(inconsistent(path, detail));
        }
        content.extend_from_slice(&data);
    }
    Ok(content)
}
