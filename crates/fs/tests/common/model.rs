//! An in-memory model of the namespace and file contents for model-based tests: inode
//! numbers are the real ones, so the model and the filesystem can be compared directly.

use std::collections::BTreeMap;

use cairn_fs::{FallocateMode, FsError, RenameMode};

/// What an operation's outcome is, compared between the model and the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    NotFound,
    Exists,
    NotDirectory,
    IsDirectory,
    NotEmpty,
    Invalid,
    NoData,
}

impl Outcome {
    pub fn of<T>(result: &Result<T, FsError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(FsError::NotFound) => Outcome::NotFound,
            Err(FsError::Exists) => Outcome::Exists,
            Err(FsError::NotDirectory) => Outcome::NotDirectory,
            Err(FsError::IsDirectory) => Outcome::IsDirectory,
            Err(FsError::NotEmpty) => Outcome::NotEmpty,
            Err(FsError::InvalidArgument(_)) => Outcome::Invalid,
            Err(FsError::NoData) => Outcome::NoData,
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
}

/// One inode of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File {
        data: Vec<u8>,
        nlink: u32,
    },
    Dir {
        entries: BTreeMap<Vec<u8>, u64>,
        parent: u64,
    },
}

/// Extended attributes of one inode: full name to value.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// The model: inodes by number, and their extended attributes.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub nodes: BTreeMap<u64, Node>,
    pub xattrs: BTreeMap<u64, Xattrs>,
}

impl Model {
    pub fn new(root: u64) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            root,
            Node::Dir {
                entries: BTreeMap::new(),
                parent: root,
            },
        );
        Model {
            nodes,
            xattrs: BTreeMap::new(),
        }
    }

    pub fn dirs(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n, Node::Dir { .. }))
            .map(|(k, _)| *k)
            .collect()
    }

    pub fn files(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(k, _)| *k)
            .collect()
    }

    pub fn entry(&self, dir: u64, name: &[u8]) -> Option<u64> {
        match self.nodes.get(&dir) {
            Some(Node::Dir { entries, .. }) => entries.get(name).copied(),
            _ => None,
        }
    }

    pub fn is_dir(&self, inode: u64) -> bool {
        matches!(self.nodes.get(&inode), Some(Node::Dir { .. }))
    }

    fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir { entries, .. }) => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn parent_of(&self, dir: u64) -> u64 {
        match self.nodes.get(&dir) {
            Some(Node::Dir { parent, .. }) => *parent,
            _ => dir,
        }
    }

    /// Whether `above` is `dir` or one of its ancestors.
    pub fn is_ancestor(&self, above: u64, dir: u64) -> bool {
        let mut current = dir;
        loop {
            if current == above {
                return true;
            }
            let parent = self.parent_of(current);
            if parent == current {
                return false;
            }
            current = parent;
        }
    }

    pub fn add(&mut self, dir: u64, name: &[u8], inode: u64, node: Node) {
        self.entries_mut(dir).insert(name.to_vec(), inode);
        self.nodes.insert(inode, node);
    }

    pub fn link(&mut self, inode: u64, dir: u64, name: &[u8]) {
        self.entries_mut(dir).insert(name.to_vec(), inode);
        if let Some(Node::File { nlink, .. }) = self.nodes.get_mut(&inode) {
            *nlink += 1;
        }
    }

    /// Drops one link of `inode` (a directory goes whole).
    fn drop_link(&mut self, inode: u64) {
        match self.nodes.get_mut(&inode) {
            Some(Node::File { nlink, .. }) if *nlink > 1 => *nlink -= 1,
            _ => {
                self.nodes.remove(&inode);
                self.xattrs.remove(&inode);
            }
        }
    }

    pub fn unlink(&mut self, dir: u64, name: &[u8], want_dir: bool) -> Outcome {
        let Some(inode) = self.entry(dir, name) else {
            return Outcome::NotFound;
        };
        match (want_dir, self.nodes.get(&inode)) {
            (false, Some(Node::Dir { .. })) => return Outcome::IsDirectory,
            (true, Some(Node::File { .. })) => return Outcome::NotDirectory,
            (true, Some(Node::Dir { entries, .. })) if !entries.is_empty() => {
                return Outcome::NotEmpty;
            }
            _ => {}
        }
        self.entries_mut(dir).remove(name);
        self.drop_link(inode);
        Outcome::Ok
    }

    /// Renames as `Filesystem::rename` does, checking in the same order.
    pub fn rename(&mut self, from: (u64, &[u8]), to: (u64, &[u8]), mode: RenameMode) -> Outcome {
        let Some(source) = self.entry(from.0, from.1) else {
            return Outcome::NotFound;
        };
        let target = self.entry(to.0, to.1);
        if target == Some(source) {
            return match mode {
                RenameMode::NoReplace => Outcome::Exists,
                _ => Outcome::Ok,
            };
        }
        match (mode, target) {
            (RenameMode::NoReplace, Some(_)) => return Outcome::Exists,
            (RenameMode::Exchange, None) => return Outcome::NotFound,
            _ => {}
        }
        if self.is_dir(source) && self.is_ancestor(source, to.0) {
            return Outcome::Invalid;
        }
        if let Some(target) = target
            && self.is_ancestor(target, from.0)
        {
            return match mode {
                RenameMode::Exchange => Outcome::Invalid,
                _ => Outcome::NotEmpty,
            };
        }
        match (mode, target) {
            (RenameMode::Exchange, Some(target)) => self.exchange(from, to, source, target),
            (_, Some(target)) => self.replace(from, to, source, target),
            (_, None) => {
                self.entries_mut(from.0).remove(from.1);
                self.entries_mut(to.0).insert(to.1.to_vec(), source);
                self.set_parent(source, to.0);
                Outcome::Ok
            }
        }
    }

    fn set_parent(&mut self, inode: u64, new_parent: u64) {
        if let Some(Node::Dir { parent, .. }) = self.nodes.get_mut(&inode) {
            *parent = new_parent;
        }
    }

    fn replace(
        &mut self,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        source: u64,
        target: u64,
    ) -> Outcome {
        match (self.is_dir(source), self.nodes.get(&target)) {
            (true, Some(Node::File { .. })) => return Outcome::NotDirectory,
            (false, Some(Node::Dir { .. })) => return Outcome::IsDirectory,
            (true, Some(Node::Dir { entries, .. })) if !entries.is_empty() => {
                return Outcome::NotEmpty;
            }
            _ => {}
        }
        self.entries_mut(from.0).remove(from.1);
        self.entries_mut(to.0).insert(to.1.to_vec(), source);
        self.drop_link(target);
        self.set_parent(source, to.0);
        Outcome::Ok
    }

    fn exchange(
        &mut self,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        source: u64,
        target: u64,
    ) -> Outcome {
        self.entries_mut(from.0).insert(from.1.to_vec(), target);
        self.entries_mut(to.0).insert(to.1.to_vec(), source);
        self.set_parent(source, to.0);
        self.set_parent(target, from.0);
        Outcome::Ok
    }

    /// Writes `bytes` at `offset` of file `inode`.
    pub fn write(&mut self, inode: u64, offset: usize, bytes: &[u8]) {
        if let Some(Node::File { data, .. }) = self.nodes.get_mut(&inode) {
            if data.len() < offset + bytes.len() {
                data.resize(offset + bytes.len(), 0);
            }
            data[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
    }

    pub fn truncate(&mut self, inode: u64, size: usize) {
        if let Some(Node::File { data, .. }) = self.nodes.get_mut(&inode) {
            data.resize(size, 0);
        }
    }

    /// Applies `fallocate`: allocation extends the size unless kept; punch and zero range
    /// zero the bytes inside the file (zero range may extend it); collapse removes the
    /// range, insert puts that many zeros at its offset (the caller checked the range).
    pub fn fallocate(&mut self, inode: u64, offset: usize, len: usize, mode: FallocateMode) {
        let Some(Node::File { data, .. }) = self.nodes.get_mut(&inode) else {
            return;
        };
        let end = offset + len;
        let grow = match mode {
            FallocateMode::Allocate { keep_size } | FallocateMode::ZeroRange { keep_size } => {
                !keep_size
            }
            FallocateMode::PunchHole => false,
            FallocateMode::CollapseRange => {
                data.drain(offset..end);
                return;
            }
            FallocateMode::InsertRange => {
                data.splice(offset..offset, std::iter::repeat_n(0, len));
                return;
            }
        };
        if grow && data.len() < end {
            data.resize(end, 0);
        }
        if !matches!(mode, FallocateMode::Allocate { .. }) {
            let stop = end.min(data.len());
            if offset < stop {
                data[offset..stop].fill(0);
            }
        }
    }

    pub fn setxattr(&mut self, inode: u64, name: &[u8], value: &[u8]) {
        self.xattrs
            .entry(inode)
            .or_default()
            .insert(name.to_vec(), value.to_vec());
    }

    pub fn removexattr(&mut self, inode: u64, name: &[u8]) -> Outcome {
        let removed = self.xattrs.get_mut(&inode).and_then(|x| x.remove(name));
        match removed {
            Some(_) => Outcome::Ok,
            None => Outcome::NoData,
        }
    }
}
