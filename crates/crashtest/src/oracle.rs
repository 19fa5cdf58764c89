//! The persisted-state oracle: from a trace and a crash point, what the recovered tree must
//! hold (everything a completed fsync, fdatasync or sync covered and nothing changed since)
//! and what it may hold (any name, size and sector contents the model had at some step that
//! could have reached the device).
//!
//! Rules, conservative on purpose:
//! - `sync` (and a clean unmount) persists every name, and the contents and extended
//!   attributes of every file and directory;
//! - `fsync(file)` persists its contents, size and extended attributes, and each of its names
//!   whose parent directory is the root or itself persisted; `fdatasync(file)` persists
//!   contents and size (fallocate's changes included);
//! - `fsync(dir)` persists the directory's entries (a rename's new name in it, a removed or
//!   renamed-away name's absence) and its extended attributes;
//! - a promise about a path lapses when a later step that may have reached the device changed
//!   that path; a promise about contents then widens to any later version.

use std::collections::{BTreeMap, BTreeSet};

use cairn_fs::FileKind;

use crate::model::{NodeId, NodeKind, Path, Version, parent_of};
use crate::op::Op;
use crate::runner::Trace;
use crate::walk::Tree;

/// Granularity of the contents check: a device sector is written whole or not at all.
pub const CONTENT_SECTOR_BYTES: usize = 512;

/// What one crash point promises, derived from a trace.
#[derive(Debug)]
pub struct Expectation<'a> {
    trace: &'a Trace,
    /// Last step whose writes may be on the device (`None`: only the base state).
    last_step: Option<usize>,
    /// Path -> (node, step of the promise).
    required: BTreeMap<Path, (NodeId, usize)>,
    /// Paths that must not exist (removed and persisted), with the step of the promise.
    absent: BTreeMap<Path, usize>,
    /// Node -> step from which its contents are promised.
    contents: BTreeMap<NodeId, usize>,
    /// Node -> step from which its extended attributes are promised.
    xattrs: BTreeMap<NodeId, usize>,
}

fn kind_matches(kind: NodeKind, seen: FileKind) -> bool {
    matches!(
        (kind, seen),
        (NodeKind::File, FileKind::Regular)
            | (NodeKind::Dir, FileKind::Directory)
            | (NodeKind::Symlink, FileKind::Symlink)
    )
}

impl<'a> Expectation<'a> {
    /// The promises in force after a crash that kept `flush_index` flushes.
    pub fn new(trace: &'a Trace, flush_index: usize) -> Self {
        let last_step = trace
            .steps
            .iter()
            .rposition(|step| step.start_flush <= flush_index);
        let mut expectation = Self {
            trace,
            last_step,
            required: BTreeMap::new(),
            absent: BTreeMap::new(),
            contents: BTreeMap::new(),
            xattrs: BTreeMap::new(),
        };
        for (index, step) in trace.steps.iter().enumerate() {
            if step.op.is_persist() && step.end_flush <= flush_index {
                expectation.promise(index);
            }
        }
        expectation.drop_lapsed();
        expectation
    }

    fn names_at(&self, step: Option<usize>) -> &BTreeMap<Path, NodeId> {
        match step {
            None => &self.trace.base_names,
            Some(index) => &self.trace.steps[index].names,
        }
    }

    /// Every path named at some step up to `step`, before or at it.
    fn ever_named(&self, step: usize) -> BTreeSet<&Path> {
        let mut all: BTreeSet<&Path> = self.trace.base_names.keys().collect();
        for record in &self.trace.steps[..step] {
            all.extend(record.names.keys());
        }
        all
    }

    fn promise(&mut self, step: usize) {
        let record = &self.trace.steps[step];
        let names = self.names_at(Some(step)).clone();
        let model = &self.trace.model;
        match &record.op {
            Op::Sync | Op::Unmount => {
                for (path, node) in &names {
                    self.required.insert(path.clone(), (*node, step));
                    self.contents.insert(*node, step);
                    self.xattrs.insert(*node, step);
                }
                let gone: Vec<Path> = self
                    .ever_named(step)
                    .into_iter()
                    .filter(|path| !names.contains_key(*path))
                    .cloned()
                    .collect();
                self.absent
                    .extend(gone.into_iter().map(|path| (path, step)));
            }
            Op::Fsync(path) | Op::Fdatasync(path) => {
                let Some(node) = record.node else { return };
                match model.nodes[node].kind {
                    NodeKind::Dir => self.promise_dir(path, &names, step),
                    _ => {
                        self.contents.insert(node, step);
                    }
                }
                if matches!(record.op, Op::Fsync(_)) {
                    self.xattrs.insert(node, step);
                    self.promise_names(node, &names, step);
                }
            }
            _ => {}
        }
    }

    fn promise_dir(&mut self, dir: &str, names: &BTreeMap<Path, NodeId>, step: usize) {
        for (path, node) in names.iter().filter(|(path, _)| parent_of(path) == dir) {
            self.required.insert(path.clone(), (*node, step));
        }
        let gone: Vec<Path> = self
            .ever_named(step)
            .into_iter()
            .filter(|path| parent_of(path) == dir && !names.contains_key(*path))
            .cloned()
            .collect();
        self.absent
            .extend(gone.into_iter().map(|path| (path, step)));
    }

    fn promise_names(&mut self, node: NodeId, names: &BTreeMap<Path, NodeId>, step: usize) {
        for (path, _) in names.iter().filter(|(_, named)| **named == node) {
            let parent = parent_of(path);
            if parent.is_empty() || self.required.contains_key(parent) {
                self.required.insert(path.clone(), (node, step));
            }
        }
    }

    /// Whether a step after `since`, up to the last step that may have reached the device,
    /// changed what `path` names.
    fn changed_after(&self, path: &str, since: usize) -> bool {
        let Some(last) = self.last_step else {
            return false;
        };
        (since + 1..=last).any(|step| {
            let before = self.names_at(Some(step - 1)).get(path);
            before != self.names_at(Some(step)).get(path)
        })
    }

    fn drop_lapsed(&mut self) {
        let required = std::mem::take(&mut self.required);
        self.required = required
            .into_iter()
            .filter(|(path, (_, since))| !self.changed_after(path, *since))
            .collect();
        let absent = std::mem::take(&mut self.absent);
        self.absent = absent
            .into_iter()
            .filter(|(path, since)| !self.changed_after(path, *since))
            .collect();
    }

    /// The versions of `node` the recovered state may come from, given the promises made
    /// about that part of its state (`contents` or `xattrs`).
    fn allowed_versions(
        &self,
        node: NodeId,
        promised: &BTreeMap<NodeId, usize>,
    ) -> Vec<&'a Version> {
        let versions = &self.trace.model.nodes[node].versions;
        let first = match promised.get(&node) {
            Some(&since) => self.trace.model.nodes[node]
                .version_at(Some(since))
                .unwrap_or(0),
            None => 0,
        };
        versions[first..]
            .iter()
            .filter(|version| version.step <= self.last_step)
            .collect()
    }

    /// Every violation of the promises by `tree`; empty when the state is acceptable.
    pub fn check(&self, tree: &Tree) -> Vec<String> {
        let mut problems = Vec::new();
        let model = &self.trace.model;
        for (path, (node, since)) in &self.required {
            let promise = &self.trace.steps[*since].op;
            match tree.entries.get(path) {
                None => problems.push(format!("{path}: missing, persisted by {promise}")),
                Some(seen) if seen.inode != model.nodes[*node].inode => problems.push(format!(
                    "{path}: inode {} but {promise} persisted inode {}",
                    seen.inode, model.nodes[*node].inode
                )),
                Some(_) => {}
            }
        }
        for (path, since) in &self.absent {
            if tree.entries.contains_key(path) {
                let promise = &self.trace.steps[*since].op;
                problems.push(format!(
                    "{path}: present, but its removal was persisted by {promise}"
                ));
            }
        }
        for (path, seen) in &tree.entries {
            if let Err(problem) = self.check_entry(path, seen) {
                problems.push(format!("{path}: {problem}"));
            }
        }
        problems.extend(check_links(tree));
        problems
    }

    /// The nodes `path` named with inode `inode` at some step that may have reached the device.
    fn candidates(&self, path: &str, inode: u64) -> BTreeSet<NodeId> {
        let last = self.last_step.map_or(0, |step| step + 1);
        std::iter::once(None)
            .chain((0..last).map(Some))
            .filter_map(|step| self.names_at(step).get(path).copied())
            .filter(|node| self.trace.model.nodes[*node].inode == inode)
            .collect()
    }

    fn check_entry(&self, path: &str, seen: &crate::walk::Seen) -> Result<(), String> {
        let candidates = self.candidates(path, seen.inode);
        if candidates.is_empty() {
            return Err(format!("inode {} never had this name", seen.inode));
        }
        let mut last_problem = String::new();
        for node in candidates {
            let model_node = &self.trace.model.nodes[node];
            if !kind_matches(model_node.kind, seen.kind) {
                last_problem = format!("is a {:?}, model has {:?}", seen.kind, model_node.kind);
                continue;
            }
            let verdict = match model_node.kind {
                NodeKind::File => {
                    content_ok(&seen.content, &self.allowed_versions(node, &self.contents))
                        .and_then(|()| self.xattrs_ok(node, seen))
                }
                NodeKind::Dir => self.xattrs_ok(node, seen),
                NodeKind::Symlink if seen.target != model_node.target => Err(format!(
                    "symlink target {:?}",
                    String::from_utf8_lossy(&seen.target)
                )),
                NodeKind::Symlink => Ok(()),
            };
            match verdict {
                Ok(()) => return Ok(()),
                Err(problem) => last_problem = problem,
            }
        }
        Err(last_problem)
    }
}

impl Expectation<'_> {
    /// The recovered attributes equal those of one allowed version (each change is atomic).
    fn xattrs_ok(&self, node: NodeId, seen: &crate::walk::Seen) -> Result<(), String> {
        let versions = self.allowed_versions(node, &self.xattrs);
        if versions.iter().any(|v| *v.xattrs == seen.xattrs) {
            return Ok(());
        }
        let names: Vec<String> = seen
            .xattrs
            .iter()
            .map(|(name, value)| format!("{}={}B", String::from_utf8_lossy(name), value.len()))
            .collect();
        Err(format!(
            "xattrs [{}] match no version ({} allowed)",
            names.join(", "),
            versions.len()
        ))
    }
}

/// Checks recovered `data` against the versions it may come from: its size is one of theirs,
/// and every sector equals that sector of some version long enough to hold it.
pub fn content_ok(data: &[u8], versions: &[&Version]) -> Result<(), String> {
    if versions.is_empty() {
        return Err("file has no allowed version".into());
    }
    if !versions.iter().any(|v| v.content.len() == data.len()) {
        let sizes: BTreeSet<usize> = versions.iter().map(|v| v.content.len()).collect();
        return Err(format!("size {} not among {sizes:?}", data.len()));
    }
    for (index, sector) in data.chunks(CONTENT_SECTOR_BYTES).enumerate() {
        let start = index * CONTENT_SECTOR_BYTES;
        let end = start + sector.len();
        let known = versions
            .iter()
            .any(|v| v.content.len() >= end && v.content[start..end] == *sector);
        if !known {
            let zeros = sector.iter().all(|&byte| byte == 0);
            return Err(format!(
                "bytes {start}..{end} match no version (all zero: {zeros}; {} allowed)",
                versions.len()
            ));
        }
    }
    Ok(())
}

/// Link counts: a file's equals its names in the tree, a directory's is 2 plus its subdirs.
fn check_links(tree: &Tree) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names: BTreeMap<u64, u32> = BTreeMap::new();
    let mut subdirs: BTreeMap<&str, u32> = BTreeMap::new();
    for (path, seen) in &tree.entries {
        *names.entry(seen.inode).or_default() += 1;
        if seen.kind == FileKind::Directory {
            *subdirs.entry(parent_of(path)).or_default() += 1;
        }
    }
    let root_want = 2 + subdirs.get("").copied().unwrap_or(0);
    if tree.root_nlink != root_want {
        problems.push(format!(
            "root: nlink {} but {root_want} expected",
            tree.root_nlink
        ));
    }
    for (path, seen) in &tree.entries {
        let want = match seen.kind {
            FileKind::Directory => 2 + subdirs.get(path.as_str()).copied().unwrap_or(0),
            _ => names.get(&seen.inode).copied().unwrap_or(0),
        };
        if seen.nlink != want {
            problems.push(format!(
                "{path}: nlink {} but {want} names/subdirs",
                seen.nlink
            ));
        }
    }
    problems
}
