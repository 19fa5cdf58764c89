//! The persisted-state oracle: from a trace and a crash point, what the recovered tree must
//! hold (everything a completed fsync, fdatasync or sync covered and nothing changed since)
//! and what it may hold (any name, size and sector contents the model had at some step that
//! could have reached the device).
//!
//! Rules, conservative on purpose:
//! - `sync` (and a clean unmount) persists every name, and the contents and extended
//!   attributes of every file and directory;
//! - `fsync(file)` persists its contents, size and extended attributes, and each of its names
//!   as an entry of its parent directory; `fdatasync(file)` persists contents and size
//!   (fallocate's changes included);
//! - `fsync(dir)` persists the directory's entries (a rename's new name in it, a removed or
//!   renamed-away name's absence) and its extended attributes;
//! - an fsync promises entries of a directory, not where that directory sits: a rename of an
//!   ancestor that no persist covered may be lost, so the entry is checked wherever the
//!   recovered tree holds the directory (sync's promises are whole paths);
//! - a promise about a path or an entry lapses when a later step that may have reached the
//!   device changed it; a promise about contents then widens to any later version;
//! - `wait` (the commit window passing) promises what `sync` does;
//! - the replace patterns (ext4's `auto_da_alloc`, which cairn follows): a file renamed over
//!   a regular file shows, where the rename left it, its content as of the rename or later
//!   (never the emptier versions before, which a crash could show under its old name);
//!   a rewrite (`open(O_TRUNC)`, write, close in one step) never shows the emptied file
//!   unless a checkpoint completed inside the step (a device flush in it: `logmode=sync`).

use std::collections::{BTreeMap, BTreeSet};

use cairn_fs::{FallocateMode, FileKind, RenameMode};

use crate::model::{NodeId, NodeKind, Path, Version, join, name_of, parent_of};
use crate::op::Op;
use crate::runner::Trace;
use crate::walk::Tree;

/// Granularity of the contents check: a device sector is written whole or not at all.
pub const CONTENT_SECTOR_BYTES: usize = 512;

/// A directory entry wherever its directory sits: the directory (`None`: the root) and a name.
type Entry = (Option<NodeId>, String);

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
    /// Entry -> (node, step of the promise), from fsync and fdatasync.
    entries: BTreeMap<Entry, (NodeId, usize)>,
    /// Entries that must not exist, with the step of the promise.
    absent_entries: BTreeMap<Entry, usize>,
    /// Node -> step from which its contents are promised.
    contents: BTreeMap<NodeId, usize>,
    /// Node -> step from which its extended attributes are promised.
    xattrs: BTreeMap<NodeId, usize>,
    /// (Path, node) -> step of a rename that moved the file there over a regular file: its
    /// contents there are promised from that step (see the module comment).
    replaced: BTreeMap<(Path, NodeId), usize>,
}

fn kind_matches(kind: NodeKind, seen: FileKind) -> bool {
    matches!(
        (kind, seen),
        (NodeKind::File, FileKind::Regular)
            | (NodeKind::Dir, FileKind::Directory)
            | (NodeKind::Symlink, FileKind::Symlink)
            | (NodeKind::Whiteout, FileKind::CharDevice)
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
            entries: BTreeMap::new(),
            absent_entries: BTreeMap::new(),
            contents: BTreeMap::new(),
            xattrs: BTreeMap::new(),
            replaced: BTreeMap::new(),
        };
        for (index, step) in trace.steps.iter().enumerate() {
            if step.op.is_persist() && step.end_flush <= flush_index {
                expectation.promise(index);
            }
        }
        let reached = last_step.map_or(0, |step| step + 1);
        for index in 0..reached {
            expectation.note_replacing_rename(index);
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
            Op::Sync | Op::Wait | Op::Unmount => {
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

    /// Records the files a rename at `step` moved over regular files (see `replaced`).
    fn note_replacing_rename(&mut self, step: usize) {
        let Op::Rename { from, to, mode } = &self.trace.steps[step].op else {
            return;
        };
        let before = self.names_at(step.checked_sub(1)).clone();
        let after = self.names_at(Some(step)).clone();
        let is_file = |node: NodeId| self.trace.model.nodes[node].kind == NodeKind::File;
        let mut moves = vec![(to, from)];
        if *mode == RenameMode::Exchange {
            moves.push((from, to));
        }
        for (landed, left) in moves {
            let (Some(&replaced), Some(&moved)) = (before.get(landed), after.get(landed)) else {
                continue;
            };
            if *mode != RenameMode::NoReplace && is_file(replaced) && is_file(moved) {
                debug_assert_eq!(before.get(left), Some(&moved));
                self.replaced.insert((landed.clone(), moved), step);
            }
        }
    }

    fn promise_dir(&mut self, dir: &str, names: &BTreeMap<Path, NodeId>, step: usize) {
        let dir_node = names.get(dir).copied();
        for (path, node) in names.iter().filter(|(path, _)| parent_of(path) == dir) {
            let entry = (dir_node, name_of(path).to_string());
            self.entries.insert(entry, (*node, step));
        }
        for name in self.ever_entries(dir_node, step) {
            if self
                .entry_target(Some(step), &(dir_node, name.clone()))
                .is_none()
            {
                self.absent_entries.insert((dir_node, name), step);
            }
        }
    }

    fn promise_names(&mut self, node: NodeId, names: &BTreeMap<Path, NodeId>, step: usize) {
        for (path, _) in names.iter().filter(|(_, named)| **named == node) {
            let entry = (
                names.get(parent_of(path)).copied(),
                name_of(path).to_string(),
            );
            self.entries.insert(entry, (node, step));
        }
    }

    /// Where directory `dir` sits after `step` (`None` when it has no name then).
    fn dir_path(&self, step: Option<usize>, dir: Option<NodeId>) -> Option<&Path> {
        static ROOT: Path = String::new();
        match dir {
            None => Some(&ROOT),
            Some(node) => self
                .names_at(step)
                .iter()
                .find(|(_, named)| **named == node)
                .map(|(path, _)| path),
        }
    }

    /// The node `entry` names after `step`.
    fn entry_target(&self, step: Option<usize>, entry: &Entry) -> Option<NodeId> {
        let dir = self.dir_path(step, entry.0)?;
        self.names_at(step).get(&join(dir, &entry.1)).copied()
    }

    /// Every name directory `dir` held before or at `step`.
    fn ever_entries(&self, dir: Option<NodeId>, step: usize) -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        for at in std::iter::once(None).chain((0..=step).map(Some)) {
            let Some(dir_path) = self.dir_path(at, dir) else {
                continue;
            };
            let children = self.names_at(at).keys();
            let inside = children.filter(|path| parent_of(path) == dir_path.as_str());
            all.extend(inside.map(|path| name_of(path).to_string()));
        }
        all
    }

    /// Whether a step after `since`, up to the last step that may have reached the device,
    /// changed what `named` (the node a path or entry names after a step) gives.
    fn changed_after<T: PartialEq>(
        &self,
        since: usize,
        named: impl Fn(Option<usize>) -> T,
    ) -> bool {
        let Some(last) = self.last_step else {
            return false;
        };
        (since + 1..=last).any(|step| named(Some(step - 1)) != named(Some(step)))
    }

    fn path_changed_after(&self, path: &str, since: usize) -> bool {
        self.changed_after(since, |step| self.names_at(step).get(path).copied())
    }

    fn entry_changed_after(&self, entry: &Entry, since: usize) -> bool {
        self.changed_after(since, |step| self.entry_target(step, entry))
    }

    fn drop_lapsed(&mut self) {
        let required = std::mem::take(&mut self.required);
        self.required = required
            .into_iter()
            .filter(|(path, (_, since))| !self.path_changed_after(path, *since))
            .collect();
        let absent = std::mem::take(&mut self.absent);
        self.absent = absent
            .into_iter()
            .filter(|(path, since)| !self.path_changed_after(path, *since))
            .collect();
        let entries = std::mem::take(&mut self.entries);
        self.entries = entries
            .into_iter()
            .filter(|(entry, (_, since))| !self.entry_changed_after(entry, *since))
            .collect();
        let absent = std::mem::take(&mut self.absent_entries);
        self.absent_entries = absent
            .into_iter()
            .filter(|(entry, since)| !self.entry_changed_after(entry, *since))
            .collect();
    }

    /// The versions of `node` the recovered state may come from, given the promises made
    /// about that part of its state (`contents` or `xattrs`) and, for contents, a promise
    /// from step `since` (a replacing rename). A version its own step replaced (a
    /// rewrite's emptied file) counts only if that step completed a device flush: without
    /// one no checkpoint holding it can be whole on the device.
    fn allowed_versions(
        &self,
        node: NodeId,
        promised: &BTreeMap<NodeId, usize>,
        since: Option<usize>,
    ) -> Vec<&'a Version> {
        let model_node = &self.trace.model.nodes[node];
        let versions = &model_node.versions;
        let first_at = |step: Option<usize>| {
            step.and_then(|step| model_node.version_at(Some(step)))
                .unwrap_or(0)
        };
        let first = first_at(promised.get(&node).copied()).max(first_at(since));
        let transient = |index: usize| {
            let step = versions[index].step;
            versions
                .get(index + 1)
                .is_some_and(|next| next.step == step)
                && step.is_some_and(|at| {
                    let record = &self.trace.steps[at];
                    matches!(record.op, Op::Rewrite { .. })
                        && record.start_flush == record.end_flush
                })
        };
        (first..versions.len())
            .filter(|&index| versions[index].step <= self.last_step && !transient(index))
            .map(|index| &versions[index])
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
        problems.extend(self.check_dir_entries(tree));
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
                    let since = self.replaced.get(&(path.to_string(), node)).copied();
                    let versions = self.allowed_versions(node, &self.contents, since);
                    content_ok(&seen.content, &versions, self.trace.write_behind)
                        .and_then(|()| self.shift_whole(&versions, seen))
                        .and_then(|()| self.xattrs_ok(node, seen))
                }
                NodeKind::Dir => self.xattrs_ok(node, seen),
                NodeKind::Symlink if seen.target != model_node.target => Err(format!(
                    "symlink target {:?}",
                    String::from_utf8_lossy(&seen.target)
                )),
                NodeKind::Symlink => Ok(()),
                NodeKind::Whiteout if seen.rdev != 0 || seen.size != 0 => Err(format!(
                    "whiteout with device {:#x} and size {}",
                    seen.rdev, seen.size
                )),
                NodeKind::Whiteout => Ok(()),
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
    /// The paths at which `tree` holds directory `dir` (the root: the empty path).
    fn tree_dirs<'t>(&self, tree: &'t Tree, dir: Option<NodeId>) -> Vec<&'t str> {
        let Some(node) = dir else {
            return vec![""];
        };
        let inode = self.trace.model.nodes[node].inode;
        tree.entries
            .iter()
            .filter(|(_, seen)| seen.inode == inode && seen.kind == FileKind::Directory)
            .map(|(path, _)| path.as_str())
            .collect()
    }

    /// The fsync promises on entries, checked wherever the tree holds their directory.
    fn check_dir_entries(&self, tree: &Tree) -> Vec<String> {
        let mut problems = Vec::new();
        let model = &self.trace.model;
        for ((dir, name), (node, since)) in &self.entries {
            let promise = &self.trace.steps[*since].op;
            for dir_path in self.tree_dirs(tree, *dir) {
                let path = join(dir_path, name);
                match tree.entries.get(&path) {
                    None => problems.push(format!("{path}: missing, persisted by {promise}")),
                    Some(seen) if seen.inode != model.nodes[*node].inode => problems.push(format!(
                        "{path}: inode {} but {promise} persisted inode {}",
                        seen.inode, model.nodes[*node].inode
                    )),
                    Some(_) => {}
                }
            }
        }
        for ((dir, name), since) in &self.absent_entries {
            for dir_path in self.tree_dirs(tree, *dir) {
                let path = join(dir_path, name);
                if tree.entries.contains_key(&path) {
                    let promise = &self.trace.steps[*since].op;
                    problems.push(format!(
                        "{path}: present, but its removal was persisted by {promise}"
                    ));
                }
            }
        }
        problems
    }

    /// A file whose allowed versions come only from the setup and from collapse or insert
    /// ranges equals one of them whole: a shift is logged so that a crash leaves the file
    /// as it was before it or after it, while `content_ok` takes each sector on its own and
    /// would pass a file half shifted.
    fn shift_whole(&self, versions: &[&Version], seen: &crate::walk::Seen) -> Result<(), String> {
        let is_shift = |step: usize| {
            matches!(
                self.trace.steps[step].op,
                Op::Fallocate {
                    mode: FallocateMode::CollapseRange | FallocateMode::InsertRange,
                    ..
                }
            )
        };
        let shifts = versions
            .iter()
            .filter(|v| v.step.is_some_and(is_shift))
            .count();
        let setup = versions.iter().filter(|v| v.step.is_none()).count();
        if shifts == 0 || shifts + setup != versions.len() {
            return Ok(());
        }
        let whole = |v: &&&Version| {
            v.content.len() as u64 == seen.size && v.content.starts_with(&seen.content)
        };
        match versions.iter().any(|v| whole(&v)) {
            true => Ok(()),
            false => Err(format!(
                "{} bytes equal no version whole: a collapse or insert half done",
                seen.size
            )),
        }
    }

    /// The recovered attributes equal those of one allowed version (each change is atomic).
    fn xattrs_ok(&self, node: NodeId, seen: &crate::walk::Seen) -> Result<(), String> {
        let versions = self.allowed_versions(node, &self.xattrs, None);
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

/// Checks recovered `data` against the versions it may come from: every sector equals that
/// sector of some version long enough to hold it (a crash may keep some sectors of an
/// overwrite and not others), so no byte is one that nobody wrote; and its size is one of
/// theirs.
///
/// With `write_behind`, the size may also fall short of a version's, never below the
/// shortest allowed one: the content is then a prefix of what the file held. The filesystem
/// logs only a size whose bytes are on the device (`InodeData::disk_size`), and cached
/// data reaches the device at writeback, in file order, a batch at a time, so a crash may
/// keep a file shorter than written, but never a size over bytes that were not written
/// (which read as zeros). Without write-behind a size is logged with its data, whole.
/// An fsync promise narrows the allowed versions to the fsynced one and later ones, so
/// the file may not come back shorter than all of them.
pub fn content_ok(data: &[u8], versions: &[&Version], write_behind: bool) -> Result<(), String> {
    if versions.is_empty() {
        return Err("file has no allowed version".into());
    }
    let sizes: BTreeSet<usize> = versions.iter().map(|v| v.content.len()).collect();
    let size_ok = match write_behind {
        true => {
            sizes.first().is_some_and(|&least| least <= data.len())
                && sizes.last().is_some_and(|&most| data.len() <= most)
        }
        false => sizes.contains(&data.len()),
    };
    if !size_ok {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;
    use crate::runner::StepRecord;
    use crate::walk::Seen;
    use cairn_fs::RenameMode;
    use std::sync::Arc;

    fn step(op: Op, flushes: (usize, usize), node: Option<NodeId>, model: &Model) -> StepRecord {
        StepRecord {
            op,
            start_flush: flushes.0,
            end_flush: flushes.1,
            node,
            names: Arc::new(model.names.clone()),
        }
    }

    fn rename(model: &mut Model, from: &str, to: &str) {
        for path in model.subtree(from) {
            let node = model.names.remove(&path).unwrap();
            model
                .names
                .insert(format!("{to}{}", &path[from.len()..]), node);
        }
    }

    /// Base: `D` (inode 10) holding `D/f` (11) and `D/g` (12); then `rename(D, E)`,
    /// `unlink(E/g)` and `persist` of the node at `target` (flushes 0 -> 1); nothing
    /// persisted the rename itself.
    fn renamed_then(persist: Op, target: &str) -> Trace {
        let mut model = Model::default();
        model.add("D", NodeKind::Dir, 10, None);
        model.add("D/f", NodeKind::File, 11, None);
        model.add("D/g", NodeKind::File, 12, None);
        let base_names = Arc::new(model.names.clone());
        let mut steps = Vec::new();
        let mode = RenameMode::NoReplace;
        rename(&mut model, "D", "E");
        let renamed = Op::Rename {
            from: "D".into(),
            to: "E".into(),
            mode,
        };
        steps.push(step(renamed, (0, 0), None, &model));
        model.names.remove("E/g");
        steps.push(step(Op::Unlink("E/g".into()), (0, 0), None, &model));
        let node = model.node_at(target);
        steps.push(step(persist, (0, 1), node, &model));
        Trace {
            model,
            base_names,
            steps,
            write_behind: false,
        }
    }

    fn tree(entries: &[(&str, u64, FileKind)]) -> Tree {
        let entries = entries.iter().map(|&(path, inode, kind)| {
            let nlink = if kind == FileKind::Directory { 2 } else { 1 };
            let seen = Seen {
                inode,
                kind,
                nlink,
                size: 0,
                rdev: 0,
                content: Vec::new(),
                target: Vec::new(),
                xattrs: Default::default(),
            };
            (path.to_string(), seen)
        });
        let dirs = entries
            .clone()
            .filter(|(_, seen)| seen.kind == FileKind::Directory);
        Tree {
            root_nlink: 2 + dirs.count() as u32,
            entries: entries.collect(),
        }
    }

    // fdatasync(dir) promises the directory's entries wherever the recovered tree holds it:
    // under its old name when the unpersisted rename of the directory was lost, under the new
    // one otherwise; a missing entry or a removed one still present is a violation either way.
    #[test]
    fn fdatasync_dir_promises_entries_not_the_directory_path() {
        let trace = renamed_then(Op::Fdatasync("E".into()), "E");
        let expectation = Expectation::new(&trace, 1);
        let (dir, file) = (FileKind::Directory, FileKind::Regular);
        for name in ["D", "E"] {
            let (f, g) = (format!("{name}/f"), format!("{name}/g"));
            let good = tree(&[(name, 10, dir), (&f, 11, file)]);
            assert_eq!(expectation.check(&good), Vec::<String>::new(), "{name}");
            let lost = expectation.check(&tree(&[(name, 10, dir)]));
            assert_eq!(lost, [format!("{f}: missing, persisted by fdatasync(E)")]);
            let both = [(name, 10, dir), (&f, 11, file), (&g, 12, file)];
            let kept = expectation.check(&tree(&both));
            let removal = format!("{g}: present, but its removal was persisted by fdatasync(E)");
            assert!(kept.contains(&removal), "{kept:?}");
        }
    }

    // With write-behind, a file may come back as a prefix of an allowed version (shorter
    // than written, bytes right), never with zeros nobody wrote, nor shorter than every
    // allowed version (an fsync promise); without write-behind only whole versions.
    #[test]
    fn write_behind_allows_prefixes_never_zeros() {
        let version = |step, content: Vec<u8>| Version {
            step,
            content: Arc::new(content),
            xattrs: Default::default(),
        };
        let old = version(None, vec![1; 700]);
        let new = version(Some(0), vec![2; 1500]);
        let prefix = vec![2; 1024];
        assert!(content_ok(&prefix, &[&old, &new], true).is_ok());
        assert!(content_ok(&prefix, &[&old, &new], false).is_err());
        // The fsynced version is the only one allowed: shorter is a loss.
        assert!(content_ok(&vec![1; 512], &[&old], true).is_err());
        // The size of the new version over the old version's bytes then zeros: the
        // failure this oracle exists for (a size logged before its data).
        let mut zeroed = vec![2; 1500];
        zeroed[700..].fill(0);
        zeroed[..700].fill(1);
        assert!(content_ok(&zeroed, &[&old, &new], true).is_err());
        let mut inside = vec![2; 1500];
        inside[..512].fill(0);
        assert!(content_ok(&inside, &[&old, &new], true).is_err());
        assert!(content_ok(&[], &[&old, &new], true).is_err());
    }

    // fsync(file) promises the file's name as an entry of its directory, not the directory's
    // new name: the file may come back under the directory's old name.
    #[test]
    fn fsync_file_promises_its_entry_not_the_directory_path() {
        let trace = renamed_then(Op::Fsync("E/f".into()), "E/f");
        let expectation = Expectation::new(&trace, 1);
        let (dir, file) = (FileKind::Directory, FileKind::Regular);
        for name in ["D", "E"] {
            let f = format!("{name}/f");
            let good = tree(&[(name, 10, dir), (&f, 11, file)]);
            assert_eq!(expectation.check(&good), Vec::<String>::new(), "{name}");
            let lost = expectation.check(&tree(&[(name, 10, dir)]));
            assert_eq!(lost, [format!("{f}: missing, persisted by fsync(E/f)")]);
        }
    }
}
