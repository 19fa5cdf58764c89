//! Workload operations and their effect on the model (the "expected" side of every run).

use std::fmt;

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
            Self::Fsync(_) | Self::Fdatasync(_) | Self::Sync | Self::Unmount
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
            | Self::Truncate { path, .. }
            | Self::Symlink { path, .. } => path,
            Self::Link { to, .. } => to,
            Self::Sync | Self::Unmount => "",
        }
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
            Self::Truncate { path, size } => write!(f, "truncate({path}, {size})"),
            Self::Link { from, to } => write!(f, "link({from}, {to})"),
            Self::Unlink(path) => write!(f, "unlink({path})"),
            Self::Rmdir(path) => write!(f, "rmdir({path})"),
            Self::Symlink { path, .. } => write!(f, "symlink({path})"),
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
        Op::Write { path, .. } | Op::Truncate { path, .. } => file(path),
        Op::Link { from, to } => file(from) && fresh(model, to),
        Op::Unlink(path) => matches!(
            kind_at(model, path),
            Some(NodeKind::File | NodeKind::Symlink)
        ),
        Op::Rmdir(path) => {
            kind_at(model, path) == Some(NodeKind::Dir)
                && !path.is_empty()
                && model.children(path).is_empty()
        }
        Op::Fsync(path) | Op::Fdatasync(path) => kind_at(model, path).is_some(),
        Op::Sync | Op::Unmount => true,
    }
}

/// Applies `op` (valid on `model`) at `step`; `inode` is the real inode of a new node.
/// Returns the node the op created or changed, if any.
pub fn apply(model: &mut Model, op: &Op, step: Option<usize>, inode: u64) -> Option<NodeId> {
    let at = step.unwrap_or(0);
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
        Op::Unlink(path) | Op::Rmdir(path) => model.names.remove(path),
        Op::Fsync(path) | Op::Fdatasync(path) => model.node_at(path),
        Op::Sync | Op::Unmount => None,
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
    ]
}
