//! The reference model: a namespace of full paths onto nodes, and every version of every
//! node's contents, so the oracle can tell which states a crash may legally leave.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Index of a node in [`Model::nodes`].
pub type NodeId = usize;

/// A full path below the root, components joined by '/'; the root is the empty string.
pub type Path = String;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    /// A whiteout (`RENAME_WHITEOUT`): a character device 0/0.
    Whiteout,
}

/// Extended attributes of a node at one moment.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// One state of a node, in effect from `step` on (`None` = before the workload started).
#[derive(Debug, Clone)]
pub struct Version {
    pub step: Option<usize>,
    pub content: Arc<Vec<u8>>,
    pub xattrs: Arc<Xattrs>,
}

/// One file, directory or symlink of the model.
#[derive(Debug, Clone)]
pub struct Node {
    pub kind: NodeKind,
    /// The inode number the real filesystem gave it.
    pub inode: u64,
    /// Symlink target (empty for other kinds).
    pub target: Vec<u8>,
    /// Every state of the node, oldest first; never empty.
    pub versions: Vec<Version>,
}

impl Node {
    /// The current state.
    pub fn current(&self) -> &Version {
        // `versions` is never empty: a node is built with its first version.
        &self.versions[self.versions.len() - 1]
    }

    /// The version in effect after `step` (`None` = before the workload), if the node existed.
    pub fn version_at(&self, step: Option<usize>) -> Option<usize> {
        self.versions
            .iter()
            .rposition(|version| version.step <= step)
    }
}

/// The model filesystem: nodes and the current namespace.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub nodes: Vec<Node>,
    /// Every name below the root, by full path.
    pub names: BTreeMap<Path, NodeId>,
}

/// The parent path of `path` ("" for a top-level name).
pub fn parent_of(path: &str) -> &str {
    path.rfind('/').map_or("", |at| &path[..at])
}

/// The last component of `path`.
pub fn name_of(path: &str) -> &str {
    path.rfind('/').map_or(path, |at| &path[at + 1..])
}

/// `child` joined below `parent`.
pub fn join(parent: &str, child: &str) -> Path {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}/{child}")
    }
}

impl Model {
    /// Adds a node made at `step` and names it `path`.
    pub fn add(&mut self, path: &str, kind: NodeKind, inode: u64, step: Option<usize>) -> NodeId {
        let id = self.nodes.len();
        self.nodes.push(Node {
            kind,
            inode,
            target: Vec::new(),
            versions: vec![Version {
                step,
                content: Arc::new(Vec::new()),
                xattrs: Arc::new(Xattrs::new()),
            }],
        });
        self.names.insert(path.to_string(), id);
        id
    }

    /// The node named `path`, if any.
    pub fn node_at(&self, path: &str) -> Option<NodeId> {
        self.names.get(path).copied()
    }

    /// Records a new state of `id` at `step` (`None`: in the setup, before the workload).
    pub fn set_state(&mut self, id: NodeId, step: Option<usize>, content: Vec<u8>, xattrs: Xattrs) {
        self.nodes[id].versions.push(Version {
            step,
            content: Arc::new(content),
            xattrs: Arc::new(xattrs),
        });
    }

    /// The names directly inside directory `dir`.
    pub fn children(&self, dir: &str) -> Vec<Path> {
        self.names
            .keys()
            .filter(|path| parent_of(path) == dir && !path.is_empty())
            .cloned()
            .collect()
    }

    /// Every name at or below `path`.
    pub fn subtree(&self, path: &str) -> Vec<Path> {
        let prefix = format!("{path}/");
        self.names
            .keys()
            .filter(|name| name.as_str() == path || name.starts_with(&prefix))
            .cloned()
            .collect()
    }

    /// Every path naming node `id`.
    pub fn paths_of(&self, id: NodeId) -> Vec<Path> {
        self.names
            .iter()
            .filter(|(_, node)| **node == id)
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Whether `path` is a directory (the root is).
    pub fn is_dir(&self, path: &str) -> bool {
        path.is_empty()
            || self
                .node_at(path)
                .is_some_and(|id| self.nodes[id].kind == NodeKind::Dir)
    }
}

/// A byte pattern unique to (`write_id`, position): foreign or stale data never matches it.
pub fn pattern(write_id: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|index| {
            let mut z = (write_id << 40) ^ (offset + index);
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks path helpers and that patterns differ between writes at the same offset.
    #[test]
    fn paths_and_patterns() {
        assert_eq!(parent_of("a/b/c"), "a/b");
        assert_eq!(parent_of("a"), "");
        assert_eq!(name_of("a/b/c"), "c");
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("a", "x"), "a/x");
        assert_ne!(pattern(1, 0, 64), pattern(2, 0, 64));
        assert_eq!(pattern(3, 10, 8), pattern(3, 10, 8));
        let mut model = Model::default();
        let dir = model.add("d", NodeKind::Dir, 10, None);
        model.add("d/f", NodeKind::File, 11, None);
        assert_eq!(model.children("d"), vec!["d/f".to_string()]);
        assert_eq!(model.subtree("d").len(), 2);
        assert_eq!(model.paths_of(dir), vec!["d".to_string()]);
        assert_eq!(model.nodes[dir].version_at(None), Some(0));
    }
}
