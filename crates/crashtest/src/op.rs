//! Workload operations and their effect on the model (the "expected" side of every run).

use std::collections::BTreeMap;
use std::fmt;

use cairn_fs::{FallocateMode, RenameMode};

use crate::model::{Model, NodeId, NodeKind, Path, join, parent_of, pattern};

/// One step of a workload, on paths of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create(Path),
    Mkdir(Path),
    /// Write `len` bytes of the pattern of write `id` at `offset`.
    Write {
        path: Path,
        offset: u64,
        len: u64,
        id: u64,
    },
    Truncate {
        path: Path,
        size: u64,
    },
    Link {
        from: Path,
        to: Path,
    },
    Unlink(Path),
    Rmdir(Path),
    Symlink {
        path: Path,
        target: Vec<u8>,
    },
    /// Rename `from` to `to` (replacing, refusing to replace, or exchanging).
    Rename {
        from: Path,
        to: Path,
        mode: RenameMode,
    },
    /// `renameat2(from, to, RENAME_WHITEOUT)` (`mode` Replace or NoReplace): `from` becomes
    /// a whiteout, a character device 0/0, in the rename's transaction.
    RenameWhiteout {
        from: Path,
        to: Path,
        mode: RenameMode,
    },
    /// How programs put a file in place with `O_TMPFILE`: an unnamed file in `path`'s
    /// directory, `len` bytes of the pattern of write `id` written and fsynced, then
    /// `linkat` gives it the name `path`, then close. Crash points before the link find an
    /// unnamed file on the unlinked list, which mount frees.
    Tmpfile {
        path: Path,
        len: u64,
        id: u64,
    },
    /// Set attribute `name` (a full name, "user.x") to `len` bytes of the pattern of `id`.
    SetXattr {
        path: Path,
        name: String,
        len: u64,
        id: u64,
    },
    RemoveXattr {
        path: Path,
        name: String,
    },
    Fallocate {
        path: Path,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    },
    /// `write` through `O_DIRECT` (`Filesystem::write_direct`): with write-behind on, the
    /// file's cached pages are written back first and this write goes to the device.
    WriteDirect {
        path: Path,
        offset: u64,
        len: u64,
        id: u64,
    },
    /// One pass of the daemon's background thread (`Filesystem::background_pass`): writes
    /// back the oldest files while the cache is over a quarter of its cap, and what the
    /// commit window says is due. No effect on the model and no promise. The only op whose
    /// effect depends on time: data older than half the window goes too, and the log is
    /// forced if a commit has waited that long, so a very slow run may do more.
    Writeback,
    /// The commit window passes with no `fsync`: one background pass as of a window and a
    /// margin later (`Filesystem::background_pass_at`). Promises what `Sync` does: whatever
    /// the filesystem received that long ago is durable (`-o commit=`).
    Wait,
    /// How programs rewrite a file in place: `open(path, O_TRUNC)`, write `len` bytes of the
    /// pattern of write `id` at 0, close. The model holds the emptied file only for the
    /// step: the last close writes the new data back, so a crash shows the old content or
    /// the new, unless a checkpoint completed inside the step (see the oracle).
    Rewrite {
        path: Path,
        len: u64,
        id: u64,
    },
    /// `copy_file_range(from, from_offset, to, to_offset, len)`: with reflink and offsets at
    /// the same place in a block, the blocks between are shared and the head and tail get
    /// new blocks; the destination's size changes once (old or new after a crash).
    Clone {
        from: Path,
        to: Path,
        from_offset: u64,
        to_offset: u64,
        len: u64,
    },
    /// `lseek(path, 0, SEEK_HOLE)`: reads the mapping, so with write-behind on it writes the
    /// file's cached pages back first. No effect on the model and no promise.
    SeekHole(Path),
    Fsync(Path),
    Fdatasync(Path),
    Sync,
    /// A clean unmount (the end of every workload): as durable as `Sync`.
    Unmount,
}

impl Op {
    /// Whether the op is one of the fsync family (the only ops that promise durability).
    pub fn is_persist(&self) -> bool {
        matches!(
            self,
            Self::Fsync(_) | Self::Fdatasync(_) | Self::Sync | Self::Wait | Self::Unmount
        )
    }

    /// The path the op changes or persists (empty for sync).
    pub fn primary_path(&self) -> &str {
        match self {
            Self::Create(path)
            | Self::Mkdir(path)
            | Self::Unlink(path)
            | Self::Rmdir(path)
            | Self::Fsync(path)
            | Self::Fdatasync(path)
            | Self::Write { path, .. }
            | Self::WriteDirect { path, .. }
            | Self::Rewrite { path, .. }
            | Self::SeekHole(path)
            | Self::Truncate { path, .. }
            | Self::Symlink { path, .. }
            | Self::SetXattr { path, .. }
            | Self::RemoveXattr { path, .. }
            | Self::Fallocate { path, .. }
            | Self::Tmpfile { path, .. } => path,
            Self::Link { to, .. }
            | Self::Rename { to, .. }
            | Self::RenameWhiteout { to, .. }
            | Self::Clone { to, .. } => to,
            Self::Sync | Self::Wait | Self::Unmount | Self::Writeback => "",
        }
    }
}

/// `copy_file_range(from, from_offset, to, to_offset, len)`.
pub fn clone(from: &str, from_offset: u64, to: &str, to_offset: u64, len: u64) -> Op {
    Op::Clone {
        from: from.into(),
        to: to.into(),
        from_offset,
        to_offset,
        len,
    }
}

/// `truncate(path, size)`.
pub fn truncate(path: &str, size: u64) -> Op {
    Op::Truncate {
        path: path.into(),
        size,
    }
}

/// `fallocate(path, offset, len, mode)`.
pub fn fallocate(path: &str, offset: u64, len: u64, mode: FallocateMode) -> Op {
    Op::Fallocate {
        path: path.into(),
        offset,
        len,
        mode,
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Create(path) => write!(f, "create({path})"),
            Self::Mkdir(path) => write!(f, "mkdir({path})"),
            Self::Write {
                path, offset, len, ..
            } => write!(f, "write({path}, {offset}, {len})"),
            Self::WriteDirect {
                path, offset, len, ..
            } => write!(f, "write_direct({path}, {offset}, {len})"),
            Self::Writeback => write!(f, "writeback"),
            Self::Wait => write!(f, "wait"),
            Self::Rewrite { path, len, .. } => write!(f, "rewrite({path}, {len})"),
            Self::SeekHole(path) => write!(f, "seek_hole({path})"),
            Self::Truncate { path, size } => write!(f, "truncate({path}, {size})"),
            Self::Link { from, to } => write!(f, "link({from}, {to})"),
            Self::Clone {
                from,
                to,
                from_offset,
                to_offset,
                len,
            } => write!(
                f,
                "copy_file_range({from}, {from_offset}, {to}, {to_offset}, {len})"
            ),
            Self::Unlink(path) => write!(f, "unlink({path})"),
            Self::Rmdir(path) => write!(f, "rmdir({path})"),
            Self::Symlink { path, .. } => write!(f, "symlink({path})"),
            Self::Rename { from, to, mode } => match mode {
                RenameMode::Replace => write!(f, "rename({from}, {to})"),
                RenameMode::NoReplace => write!(f, "rename({from}, {to}, noreplace)"),
                RenameMode::Exchange => write!(f, "rename({from}, {to}, exchange)"),
            },
            Self::RenameWhiteout { from, to, mode } => match mode {
                RenameMode::NoReplace => write!(f, "rename({from}, {to}, noreplace|whiteout)"),
                _ => write!(f, "rename({from}, {to}, whiteout)"),
            },
            Self::Tmpfile { path, len, .. } => write!(f, "tmpfile({path}, {len})"),
            Self::SetXattr {
                path, name, len, ..
            } => write!(f, "setxattr({path}, {name}, {len})"),
            Self::RemoveXattr { path, name } => write!(f, "removexattr({path}, {name})"),
            Self::Fallocate {
                path,
                offset,
                len,
                mode,
            } => {
                let mode = match mode {
                    FallocateMode::Allocate { keep_size: false } => "allocate",
                    FallocateMode::Allocate { keep_size: true } => "allocate keep-size",
                    FallocateMode::PunchHole => "punch",
                    FallocateMode::ZeroRange { keep_size: false } => "zero",
                    FallocateMode::ZeroRange { keep_size: true } => "zero keep-size",
                    FallocateMode::CollapseRange => "collapse",
                    FallocateMode::InsertRange => "insert",
                };
                write!(f, "fallocate({path}, {offset}, {len}, {mode})")
            }
            Self::Fsync(path) => write!(f, "fsync({path})"),
            Self::Fdatasync(path) => write!(f, "fdatasync({path})"),
            Self::Sync => write!(f, "sync"),
            Self::Unmount => write!(f, "unmount"),
        }
    }
}

fn kind_at(model: &Model, path: &str) -> Option<NodeKind> {
    if path.is_empty() {
        return Some(NodeKind::Dir);
    }
    model.node_at(path).map(|id| model.nodes[id].kind)
}

fn fresh(model: &Model, path: &str) -> bool {
    !path.is_empty() && model.is_dir(parent_of(path)) && model.node_at(path).is_none()
}

/// Whether `op` is valid on `model` (so the real filesystem must succeed at it).
pub fn valid(model: &Model, op: &Op) -> bool {
    let file = |path: &str| kind_at(model, path) == Some(NodeKind::File);
    match op {
        Op::Create(path) | Op::Mkdir(path) | Op::Symlink { path, .. } => fresh(model, path),
        Op::Write { path, .. }
        | Op::WriteDirect { path, .. }
        | Op::Rewrite { path, .. }
        | Op::Truncate { path, .. }
        | Op::SeekHole(path) => file(path),
        Op::Link { from, to } => file(from) && fresh(model, to),
        Op::Clone {
            from,
            to,
            from_offset,
            to_offset,
            len,
        } => {
            file(from)
                && file(to)
                && !clone_overlaps(model, from, to, (*from_offset, *to_offset, *len))
        }
        Op::Unlink(path) => matches!(
            kind_at(model, path),
            Some(NodeKind::File | NodeKind::Symlink)
        ),
        Op::Rmdir(path) => {
            kind_at(model, path) == Some(NodeKind::Dir)
                && !path.is_empty()
                && model.children(path).is_empty()
        }
        Op::Rename { from, to, mode } => rename_valid(model, from, to, *mode),
        Op::RenameWhiteout { from, to, mode } => {
            *mode != RenameMode::Exchange && rename_valid(model, from, to, *mode)
        }
        Op::Tmpfile { path, .. } => fresh(model, path),
        Op::SetXattr { path, .. } => {
            matches!(kind_at(model, path), Some(NodeKind::File | NodeKind::Dir))
        }
        Op::RemoveXattr { path, name } => model.node_at(path).is_some_and(|id| {
            model.nodes[id]
                .current()
                .xattrs
                .contains_key(name.as_bytes())
        }),
        Op::Fallocate {
            path,
            offset,
            len,
            mode,
        } => {
            let size = |id: NodeId| model.nodes[id].current().content.len() as u64;
            file(path)
                && model
                    .node_at(path)
                    .is_some_and(|id| fallocate_fits(size(id), *offset, *len, *mode))
        }
        Op::Fsync(path) | Op::Fdatasync(path) => kind_at(model, path).is_some(),
        Op::Sync | Op::Wait | Op::Unmount | Op::Writeback => true,
    }
}

/// Whether a copy within one file (both names of one node) overlaps itself, on the length
/// cut at the file's end (as Linux checks it): the filesystem refuses such a copy.
fn clone_overlaps(
    model: &Model,
    from: &str,
    to: &str,
    (from_offset, to_offset, len): (u64, u64, u64),
) -> bool {
    let (Some(source), Some(target)) = (model.node_at(from), model.node_at(to)) else {
        return false;
    };
    let size = model.nodes[source].current().content.len() as u64;
    let len = len.min(size.saturating_sub(from_offset));
    source == target && from_offset < to_offset + len && to_offset < from_offset + len
}

/// Whether `inner` is `outer` or below it.
fn within(inner: &str, outer: &str) -> bool {
    inner == outer || inner.starts_with(&format!("{outer}/"))
}

/// A rename the filesystem must accept: both names below a directory, neither inside the
/// other, distinct inodes, and a target that `mode` and POSIX allow (a directory replaces
/// only an empty directory, a non-directory only a non-directory).
fn rename_valid(model: &Model, from: &str, to: &str, mode: RenameMode) -> bool {
    let Some(source) = model.node_at(from) else {
        return false;
    };
    if to.is_empty() || !model.is_dir(parent_of(to)) || within(to, from) || within(from, to) {
        return false;
    }
    let target = model.node_at(to);
    if target == Some(source) {
        return false;
    }
    let source_dir = model.is_dir(from);
    match (mode, target) {
        (RenameMode::NoReplace, target) => target.is_none(),
        (RenameMode::Exchange, target) => target.is_some(),
        (RenameMode::Replace, None) => true,
        (RenameMode::Replace, Some(_)) if source_dir => {
            model.is_dir(to) && model.children(to).is_empty()
        }
        (RenameMode::Replace, Some(_)) => !model.is_dir(to),
    }
}

/// Moves every name at or below `from` to the same place below `to`.
fn move_subtree(names: &BTreeMap<Path, NodeId>, from: &str, to: &str) -> Vec<(Path, NodeId)> {
    names
        .iter()
        .filter(|(path, _)| within(path, from))
        .map(|(path, node)| (format!("{to}{}", &path[from.len()..]), *node))
        .collect()
}

/// The namespace change of a (valid) rename.
fn apply_rename(model: &mut Model, from: &str, to: &str, mode: RenameMode) {
    let moved = move_subtree(&model.names, from, to);
    let swapped = match mode {
        RenameMode::Exchange => move_subtree(&model.names, to, from),
        _ => Vec::new(),
    };
    model
        .names
        .retain(|path, _| !within(path, from) && !within(path, to));
    model.names.extend(moved);
    model.names.extend(swapped);
}

/// `content` with `offset..end` zeroed (within its length), grown to `end` if `grow`.
fn zeroed(content: &[u8], offset: u64, end: u64, grow: bool) -> Vec<u8> {
    let mut content = content.to_vec();
    if grow && content.len() < end as usize {
        content.resize(end as usize, 0);
    }
    let end = (end as usize).min(content.len());
    if (offset as usize) < end {
        content[offset as usize..end].fill(0);
    }
    content
}

/// The contents after a fallocate of `offset..offset + len` in `mode`.
fn fallocated(content: &[u8], offset: u64, len: u64, mode: FallocateMode) -> Vec<u8> {
    let end = offset + len;
    match mode {
        FallocateMode::Allocate { keep_size } => {
            let mut content = content.to_vec();
            if !keep_size && content.len() < end as usize {
                content.resize(end as usize, 0);
            }
            content
        }
        FallocateMode::PunchHole => zeroed(content, offset, end, false),
        FallocateMode::ZeroRange { keep_size } => zeroed(content, offset, end, !keep_size),
        FallocateMode::CollapseRange => {
            let mut content = content.to_vec();
            content.drain(offset as usize..end as usize);
            content
        }
        FallocateMode::InsertRange => {
            let mut content = content.to_vec();
            let hole = std::iter::repeat_n(0, len as usize);
            content.splice(offset as usize..offset as usize, hole);
            content
        }
    }
}

/// Whether a fallocate of `offset..offset + len` in `mode` suits a file of `size` bytes:
/// collapse and insert take block-aligned ranges (`SHIFT_ALIGN`), a collapse one that ends
/// before the end of the file, an insert one that starts inside it (XFS's rules).
fn fallocate_fits(size: u64, offset: u64, len: u64, mode: FallocateMode) -> bool {
    let aligned = offset.is_multiple_of(SHIFT_ALIGN) && len.is_multiple_of(SHIFT_ALIGN);
    match mode {
        FallocateMode::CollapseRange => aligned && offset + len < size,
        FallocateMode::InsertRange => aligned && offset < size,
        _ => true,
    }
}

/// The block size of the explorer's images, which collapse and insert ranges align to.
pub const SHIFT_ALIGN: u64 = 4096;

/// Applies `op` (valid on `model`) at `step`; `inode` is the real inode of a new node.
/// Returns the node the op created or changed, if any.
pub fn apply(model: &mut Model, op: &Op, step: Option<usize>, inode: u64) -> Option<NodeId> {
    // Setup changes are recorded before every step (`None`), not at the first one.
    let at = step;
    match op {
        Op::Create(path) => Some(model.add(path, NodeKind::File, inode, step)),
        Op::Mkdir(path) => Some(model.add(path, NodeKind::Dir, inode, step)),
        Op::Symlink { path, target } => {
            let id = model.add(path, NodeKind::Symlink, inode, step);
            model.nodes[id].target.clone_from(target);
            Some(id)
        }
        Op::Write {
            path,
            offset,
            len,
            id,
        }
        | Op::WriteDirect {
            path,
            offset,
            len,
            id,
        } => {
            let node = model.node_at(path)?;
            let current = model.nodes[node].current().clone();
            let mut content = current.content.as_ref().clone();
            let end = (offset + len) as usize;
            if content.len() < end {
                content.resize(end, 0);
            }
            content[*offset as usize..end].copy_from_slice(&pattern(*id, *offset, *len as usize));
            model.set_state(node, at, content, current.xattrs.as_ref().clone());
            Some(node)
        }
        Op::Rewrite { path, len, id } => {
            let node = model.node_at(path)?;
            let xattrs = model.nodes[node].current().xattrs.as_ref().clone();
            // The emptied file, then the new content, both at this step.
            model.set_state(node, at, Vec::new(), xattrs.clone());
            model.set_state(node, at, pattern(*id, 0, *len as usize), xattrs);
            Some(node)
        }
        Op::Truncate { path, size } => {
            let node = model.node_at(path)?;
            let current = model.nodes[node].current().clone();
            let mut content = current.content.as_ref().clone();
            content.resize(*size as usize, 0);
            model.set_state(node, at, content, current.xattrs.as_ref().clone());
            Some(node)
        }
        Op::Link { from, to } => {
            let node = model.node_at(from)?;
            model.names.insert(to.clone(), node);
            Some(node)
        }
        Op::Clone {
            from,
            to,
            from_offset,
            to_offset,
            len,
        } => {
            let (source, node) = (model.node_at(from)?, model.node_at(to)?);
            let copied = model.nodes[source].current().content.clone();
            let current = model.nodes[node].current().clone();
            let mut content = current.content.as_ref().clone();
            let start = (*from_offset as usize).min(copied.len());
            let end = (start + *len as usize).min(copied.len());
            let dest = *to_offset as usize;
            if end > start {
                if content.len() < dest + end - start {
                    content.resize(dest + end - start, 0);
                }
                content[dest..dest + end - start].copy_from_slice(&copied[start..end]);
            }
            model.set_state(node, at, content, current.xattrs.as_ref().clone());
            Some(node)
        }
        Op::Unlink(path) | Op::Rmdir(path) => model.names.remove(path),
        Op::Rename { from, to, mode } => {
            apply_rename(model, from, to, *mode);
            model.node_at(to)
        }
        Op::RenameWhiteout { from, to, mode } => {
            apply_rename(model, from, to, *mode);
            // `inode` is the whiteout's: it takes the old name in the same step.
            model.add(from, NodeKind::Whiteout, inode, step);
            model.node_at(to)
        }
        Op::Tmpfile { path, len, id } => {
            let node = model.add(path, NodeKind::File, inode, step);
            let content = pattern(*id, 0, *len as usize);
            model.set_state(node, at, content, crate::model::Xattrs::new());
            Some(node)
        }
        Op::SetXattr {
            path,
            name,
            len,
            id,
        } => {
            let node = model.node_at(path)?;
            let current = model.nodes[node].current().clone();
            let mut xattrs = current.xattrs.as_ref().clone();
            xattrs.insert(name.as_bytes().to_vec(), pattern(*id, 0, *len as usize));
            model.set_state(node, at, current.content.as_ref().clone(), xattrs);
            Some(node)
        }
        Op::RemoveXattr { path, name } => {
            let node = model.node_at(path)?;
            let current = model.nodes[node].current().clone();
            let mut xattrs = current.xattrs.as_ref().clone();
            xattrs.remove(name.as_bytes());
            model.set_state(node, at, current.content.as_ref().clone(), xattrs);
            Some(node)
        }
        Op::Fallocate {
            path,
            offset,
            len,
            mode,
        } => {
            let node = model.node_at(path)?;
            let current = model.nodes[node].current().clone();
            let content = fallocated(&current.content, *offset, *len, *mode);
            model.set_state(node, at, content, current.xattrs.as_ref().clone());
            Some(node)
        }
        Op::Fsync(path) | Op::Fdatasync(path) => model.node_at(path),
        Op::Sync | Op::Wait | Op::Unmount | Op::Writeback | Op::SeekHole(_) => None,
    }
}

/// The setup every generated workload starts from (made durable before recording starts):
/// a few directories, files with data, a symlink and a hard link.
pub fn setup_ops() -> Vec<Op> {
    let write = |path: &str, len: u64, id: u64| Op::Write {
        path: path.to_string(),
        offset: 0,
        len,
        id,
    };
    vec![
        Op::Mkdir("A".into()),
        Op::Mkdir("B".into()),
        Op::Mkdir(join("A", "C")),
        Op::Mkdir("E".into()),
        Op::Create("foo".into()),
        write("foo", 16384, 1),
        Op::Create("A/bar".into()),
        write("A/bar", 6000, 2),
        Op::Create("A/C/baz".into()),
        Op::Symlink {
            path: "ln".into(),
            target: b"foo".to_vec(),
        },
        Op::Link {
            from: "A/bar".into(),
            to: "B/bar2".into(),
        },
        Op::SetXattr {
            path: "foo".into(),
            name: "user.s".into(),
            len: 16,
            id: 3,
        },
        Op::SetXattr {
            path: "A".into(),
            name: "user.big".into(),
            len: 2000,
            id: 4,
        },
    ]
}

/// Attributes `xattr_setup_ops` puts on "foo": several leaves' worth, so its attr fork is
/// in index form (leaves and an index tree) before the workload starts.
pub const BULK_XATTRS: usize = 300;

/// `setup_ops` plus `BULK_XATTRS` attributes `user.bulk-NNNN` on "foo" (values of 1 to 40
/// bytes), the setup of the attribute index workloads.
pub fn xattr_setup_ops() -> Vec<Op> {
    let mut ops = setup_ops();
    ops.extend((0..BULK_XATTRS).map(|index| Op::SetXattr {
        path: "foo".into(),
        name: bulk_xattr(index),
        len: (index % 40 + 1) as u64,
        id: 500 + index as u64,
    }));
    ops
}

/// One-block extents `shift_setup_ops` gives "frag": more than an inode holds inline, so
/// its map is an extent tree, and more than one shift step moves.
pub const SHIFT_EXTENTS: u64 = 40;

/// `setup_ops` plus "frag": `SHIFT_EXTENTS` blocks of data with a hole after each, the
/// setup of the collapse and insert workloads.
pub fn shift_setup_ops() -> Vec<Op> {
    let mut ops = setup_ops();
    ops.push(Op::Create("frag".into()));
    ops.extend((0..SHIFT_EXTENTS).map(|index| Op::Write {
        path: "frag".into(),
        offset: 2 * index * SHIFT_ALIGN,
        len: SHIFT_ALIGN,
        id: 600 + index,
    }));
    ops
}

/// The name of bulk attribute `index` of `xattr_setup_ops`.
pub fn bulk_xattr(index: usize) -> String {
    format!("user.bulk-{index:04}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::setup_model;

    fn rename(from: &str, to: &str, mode: RenameMode) -> Op {
        Op::Rename {
            from: from.into(),
            to: to.into(),
            mode,
        }
    }

    // Checks which renames are valid on the setup tree and that a directory exchange moves
    // both subtrees.
    #[test]
    fn rename_validity_and_subtrees() {
        let mut model = setup_model();
        assert!(valid(&model, &rename("foo", "A/bar", RenameMode::Replace)));
        assert!(!valid(
            &model,
            &rename("foo", "A/bar", RenameMode::NoReplace)
        ));
        assert!(!valid(&model, &rename("foo", "new", RenameMode::Exchange)));
        assert!(!valid(&model, &rename("A", "A/C/x", RenameMode::Replace)));
        assert!(!valid(
            &model,
            &rename("A/bar", "B/bar2", RenameMode::Replace)
        ));
        assert!(!valid(&model, &rename("foo", "A", RenameMode::Replace)));
        assert!(!valid(&model, &rename("E", "A", RenameMode::Replace)));
        let (bar2, baz) = (model.node_at("B/bar2"), model.node_at("A/C/baz"));
        let exchange = rename("B", "A/C", RenameMode::Exchange);
        assert!(valid(&model, &exchange));
        apply(&mut model, &exchange, Some(0), 0);
        assert_eq!(model.node_at("A/C/bar2"), bar2);
        assert_eq!(model.node_at("B/baz"), baz);
        assert_eq!(model.node_at("B/bar2"), None);
    }

    // Checks the contents each fallocate mode leaves.
    #[test]
    fn fallocate_contents() {
        let data = vec![7u8; 10];
        let zero = |keep_size| FallocateMode::ZeroRange { keep_size };
        let allocate = |keep_size| FallocateMode::Allocate { keep_size };
        assert_eq!(fallocated(&data, 8, 4, allocate(true)), data);
        assert_eq!(fallocated(&data, 8, 4, allocate(false)).len(), 12);
        let punched = fallocated(&data, 8, 4, FallocateMode::PunchHole);
        assert_eq!(punched, [7, 7, 7, 7, 7, 7, 7, 7, 0, 0]);
        assert_eq!(fallocated(&data, 8, 4, zero(true)), punched);
        assert_eq!(fallocated(&data, 8, 4, zero(false))[8..], [0, 0, 0, 0]);
    }
}
