//! Phase 2 of repair: the namespace. Entries naming a free inode, of the wrong type, with a
//! bad name, or giving a directory a second parent are removed; a directory that cannot be
//! read is emptied; inodes no longer reachable from the root are moved into `/lost+found`
//! (created when absent: root's, mode 0700; rewritten in block form by `lost_found.rs` when
//! its entries do not fit in place) under their inode number; `..` is set to the one
//! parent; block directories get their hash index rebuilt when it disagrees with their
//! entries; link counts are set to the entries naming each inode.

use std::collections::{BTreeMap, BTreeSet};

use cairn_format::dir::{
    DIR_DATA_HEADER_SIZE, DirHashRecord, ShortformDir, ShortformEntry, check_name, dir_address,
    dir_data_entries, dir_data_insert, dir_data_remove, dir_data_salvage, dir_entry_bytes,
    init_dir_data_block, split_dir_address,
};
use cairn_format::inode::{FileType, ForkFormat, INODE_CORE_SIZE, InodeCore, Timestamp};
use cairn_format::ondisk::put_u64;
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{Extent, MetaHeader, MetaKind, OnDisk};

use super::fork_map::BlockSource;
use super::{RepairError, Repairer};
use crate::check::Checker;
use crate::dir_read::{DirSource, INDEX_FILE_BASE, Listing};

const LOST_FOUND: &[u8] = b"lost+found";
/// Data address (in 8-byte units) of the first user entry of a short-form directory, after
/// the header and both markers of data block 0 (as cairn-fs assigns tags).
const FIRST_TAG: u32 = (DIR_DATA_HEADER_SIZE + dir_entry_bytes(8) + dir_entry_bytes(7)) as u32 / 8;

/// One entry as repair moves it around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    pub(super) name: Vec<u8>,
    pub(super) inode: u64,
    pub(super) file_type: FileType,
    address: u32,
}

/// The changes to one directory.
#[derive(Debug, Clone, Default)]
struct DirEdit {
    remove: Vec<(Named, String)>,
    add: Vec<Named>,
    parent: Option<u64>,
}

/// Phase 2's decisions, made from one survey.
#[derive(Debug, Default)]
pub(crate) struct NamePlan {
    restamp: Vec<(u64, u64)>,
    lost_blocks: Vec<(u64, u64, u64)>,
    sources: BTreeMap<u64, DirSource>,
    listings: BTreeMap<u64, Vec<Named>>,
    edits: BTreeMap<u64, DirEdit>,
    /// Directories that cannot be read (with their attr fork's blocks): emptied.
    unreadable: Vec<(u64, u64)>,
    /// In-use inodes no entry keeps and no unlinked list holds, with no links: cleared.
    orphans: Vec<u64>,
    /// Inodes to move into lost+found (see `plan_lost` for the order).
    lost: Vec<(u64, FileType)>,
    lost_found: Option<u64>,
    free_slot: Option<u64>,
    nlink: BTreeMap<u64, u32>,
    recorded_nlink: BTreeMap<u64, u32>,
    root: u64,
    /// Unclaimed blocks, for directories rewritten into new blocks.
    source: BlockSource,
    /// Directories rewritten whole, in block form, into new blocks: lost+found when its
    /// entries outgrow it, and block directories whose data block 0 is not mapped.
    rewrite: BTreeSet<u64>,
    /// The parent each directory should name (`u64::MAX`: one moved to lost+found).
    expected_parent: BTreeMap<u64, u64>,
}

fn named(listing: &Listing) -> Vec<Named> {
    listing
        .entries
        .iter()
        .map(|e| Named {
            name: e.name.clone(),
            inode: e.inode,
            file_type: e.file_type,
            address: e.address,
        })
        .collect()
}

impl Repairer<'_> {
    pub(crate) fn plan_namespace(&self, survey: &Checker<'_>) -> NamePlan {
        let root = self.superblock.root_inode;
        let names = &survey.findings.names;
        let mut plan = NamePlan {
            restamp: survey.findings.restamp_dir_blocks.clone(),
            lost_blocks: survey.findings.lost_dir_blocks.clone(),
            sources: names.sources.clone(),
            root,
            ..NamePlan::default()
        };
        let mut parent_of: BTreeMap<u64, u64> = BTreeMap::new();
        for (&dir, listing) in &names.listings {
            for (dropped, why) in &listing.drop {
                let entry = Named {
                    name: dropped.name.clone(),
                    inode: dropped.inode,
                    file_type: dropped.file_type,
                    address: dropped.address,
                };
                let why = (*why).to_string();
                plan.edits.entry(dir).or_default().remove.push((entry, why));
            }
            let mut kept = Vec::new();
            for entry in named(listing) {
                let seen = survey.inodes.get(&entry.inode);
                let why = match seen {
                    None => Some("names an inode that is not in use".to_string()),
                    Some(s) if s.file_type != entry.file_type => Some(format!(
                        "says {:?}, the inode is {:?}",
                        entry.file_type, s.file_type
                    )),
                    _ if check_name(&entry.name).is_err() => Some("bad name".to_string()),
                    _ if entry.inode == root || entry.inode == dir => {
                        Some("names the root or its own directory".to_string())
                    }
                    Some(s) if s.file_type == FileType::Directory => {
                        let chosen = chosen_parent(entry.inode, names);
                        (chosen != Some(dir) || parent_of.contains_key(&entry.inode))
                            .then(|| "gives a directory a second parent".to_string())
                    }
                    _ => None,
                };
                match why {
                    Some(why) => plan.edits.entry(dir).or_default().remove.push((entry, why)),
                    None => {
                        if entry.file_type == FileType::Directory {
                            parent_of.insert(entry.inode, dir);
                        }
                        kept.push(entry);
                    }
                }
            }
            plan.listings.insert(dir, kept);
        }
        for (&inode, seen) in &survey.inodes {
            plan.recorded_nlink.insert(inode, seen.nlink);
            if seen.file_type == FileType::Directory && !plan.listings.contains_key(&inode) {
                let attr_blocks = survey.findings.attr_blocks.get(&inode).copied();
                plan.unreadable.push((inode, attr_blocks.unwrap_or(0)));
                plan.listings.insert(inode, Vec::new());
            }
        }
        plan.lost_found = plan.listings.get(&root).and_then(|entries| {
            entries
                .iter()
                .find(|e| e.name == LOST_FOUND && e.file_type == FileType::Directory)
                .map(|e| e.inode)
        });
        self.plan_disconnected(survey, &mut plan, &mut parent_of);
        for &dir in plan.listings.keys() {
            let expected = if dir == root {
                root
            } else {
                parent_of.get(&dir).copied().unwrap_or(root)
            };
            let current = names.listings.get(&dir).and_then(|l| l.parent);
            if current != Some(expected) {
                plan.edits.entry(dir).or_default().parent = Some(expected);
            }
            plan.expected_parent.insert(dir, expected);
        }
        for (&dir, source) in &plan.sources {
            let listing = names.listings.get(&dir);
            let markers = listing.is_some_and(|l| l.parent.is_some() && l.index.is_some());
            if let DirSource::Blocks(extents) = source
                && (!markers || !data_blocks_complete(extents))
            {
                plan.rewrite.insert(dir);
            }
        }
        plan.free_slot = free_slot(survey);
        plan.source = BlockSource::from_survey(survey);
        plan
    }

    /// Finds orphans and the inodes to move into lost+found; counts links.
    fn plan_disconnected(
        &self,
        survey: &Checker<'_>,
        plan: &mut NamePlan,
        parent_of: &mut BTreeMap<u64, u64>,
    ) {
        let unlinked = &survey.findings.unlinked;
        let mut references: BTreeMap<u64, u32> = BTreeMap::new();
        for entries in plan.listings.values() {
            for entry in entries {
                *references.entry(entry.inode).or_default() += 1;
            }
        }
        let mut named_by: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for (&dir, entries) in &plan.listings {
            for entry in entries {
                named_by.entry(entry.inode).or_default().insert(dir);
            }
        }
        let reached = reach(plan.root, &plan.listings);
        self.plan_lost(survey, plan, (&references, &named_by), reached, parent_of);
        let mut links: BTreeMap<u64, u32> = BTreeMap::new();
        for (&dir, entries) in &plan.listings {
            let subdirs = entries
                .iter()
                .filter(|e| e.file_type == FileType::Directory)
                .count() as u32;
            *links.entry(dir).or_default() += 2 + subdirs;
            for entry in entries
                .iter()
                .filter(|e| e.file_type != FileType::Directory)
            {
                *links.entry(entry.inode).or_default() += 1;
            }
        }
        for &(inode, file_type) in &plan.lost {
            if file_type != FileType::Directory {
                *links.entry(inode).or_default() += 1;
            }
        }
        let orphans: BTreeSet<u64> = plan.orphans.iter().copied().collect();
        for (&inode, seen) in &survey.inodes {
            if unlinked.contains(&inode) || orphans.contains(&inode) {
                continue;
            }
            let wanted = links.get(&inode).copied().unwrap_or(0);
            if wanted != seen.nlink && wanted > 0 {
                plan.nlink.insert(inode, wanted);
            }
        }
    }

    /// Picks the inodes to move into lost+found (and the orphans): first the tops of the
    /// unreachable subtrees (inodes no unreachable directory names), each bringing its
    /// subtree back, in inode order; then what is still unreachable (directories naming each
    /// other in a cycle), each cut from the directories of the cycle that name it. Moving a
    /// directory before the unreachable directory that names it would cut that entry.
    fn plan_lost(
        &self,
        survey: &Checker<'_>,
        plan: &mut NamePlan,
        (references, named_by): (&BTreeMap<u64, u32>, &BTreeMap<u64, BTreeSet<u64>>),
        mut reached: BTreeSet<u64>,
        parent_of: &mut BTreeMap<u64, u64>,
    ) {
        let unlinked = &survey.findings.unlinked;
        for cycles in [false, true] {
            // What is reached only grows, so an inode passed over never qualifies later in
            // the same pass.
            for (&inode, seen) in &survey.inodes {
                let candidate = !reached.contains(&inode)
                    && !unlinked.contains(&inode)
                    && (seen.file_type == FileType::Directory || !references.contains_key(&inode));
                if !candidate {
                    continue;
                }
                if seen.nlink == 0 && !references.contains_key(&inode) {
                    plan.orphans.push(inode);
                    reached.insert(inode);
                    continue;
                }
                let namers = named_by.get(&inode).into_iter().flatten();
                if !cycles && namers.clone().any(|dir| !reached.contains(dir)) {
                    continue;
                }
                for dir in namers {
                    let Some(entries) = plan.listings.get_mut(dir) else {
                        continue;
                    };
                    if let Some(index) = entries.iter().position(|e| e.inode == inode) {
                        let entry = entries.remove(index);
                        let why = "cut from an unreachable cycle".to_string();
                        plan.edits
                            .entry(*dir)
                            .or_default()
                            .remove
                            .push((entry, why));
                    }
                }
                plan.lost.push((inode, seen.file_type));
                reached.extend(reach(inode, &plan.listings));
                if seen.file_type == FileType::Directory {
                    parent_of.insert(inode, u64::MAX);
                }
            }
        }
    }

    pub(crate) fn apply_namespace(&mut self, mut plan: NamePlan) -> Result<(), RepairError> {
        for (at, dir) in plan.restamp.clone() {
            let mut block = self.read_raw(at, 1)?;
            dir_data_salvage(&mut block)?;
            MetaHeader::new(MetaKind::DirData, at, self.uuid, dir).encode(&mut block);
            self.write_meta(at, &mut block)?;
            self.action(format!("directory {dir}: data block {at} salvaged"));
        }
        let lossy = !plan.lost_blocks.is_empty()
            || !plan.unreadable.is_empty()
            || !plan.orphans.is_empty()
            || plan.edits.values().any(|e| !e.remove.is_empty());
        if lossy && !self.may_discard() {
            self.skip("the namespace: entries or inodes would be removed".to_string());
            return Ok(());
        }
        for (at, dir, index) in plan.lost_blocks.clone() {
            let parent = plan.edits.get(&dir).and_then(|e| e.parent);
            self.write_empty_dir_block(at, dir, index, parent.unwrap_or(plan.root))?;
            self.action(format!(
                "directory {dir}: data block {at} cannot be read, emptied"
            ));
        }
        for (dir, attr_blocks) in plan.unreadable.clone() {
            self.empty_directory(dir, plan.root, attr_blocks)?;
            plan.sources.insert(dir, DirSource::Short(Vec::new()));
            self.action(format!("directory {dir}: cannot be read, emptied"));
        }
        for inode in plan.orphans.clone() {
            self.clear_inode(inode)?;
            self.action(format!("inode {inode}: has no links and no entry; cleared"));
        }
        if !plan.lost.is_empty() {
            self.move_to_lost_found(&mut plan)?;
        }
        let mut edits = std::mem::take(&mut plan.edits);
        for dir in plan.rewrite.clone() {
            let edit = edits.remove(&dir).unwrap_or_default();
            for (entry, why) in &edit.remove {
                let name = String::from_utf8_lossy(&entry.name);
                self.action(format!("directory {dir}: removed entry '{name}' ({why})"));
            }
            let parent = edit
                .parent
                .or(plan.expected_parent.get(&dir).copied())
                .filter(|&p| p != u64::MAX)
                .unwrap_or(plan.root);
            self.rewrite_directory(dir, parent, &mut plan)?;
        }
        for (dir, edit) in edits {
            let Some(source) = plan.sources.get(&dir).cloned() else {
                continue;
            };
            let entries = plan.listings.get(&dir).cloned().unwrap_or_default();
            self.edit_directory(dir, &source, &edit, &entries)?;
        }
        for (&inode, &nlink) in &plan.nlink {
            let Some(mut image) = self.read_image(inode)? else {
                continue;
            };
            let old = std::mem::replace(&mut image.core.nlink, nlink);
            if old == nlink {
                continue;
            }
            self.write_image(inode, &image)?;
            self.action(format!("inode {inode}: link count {old} set to {nlink}"));
        }
        Ok(())
    }

    /// Creates or finds lost+found and adds every lost inode to it.
    fn move_to_lost_found(&mut self, plan: &mut NamePlan) -> Result<(), RepairError> {
        let root = plan.root;
        let lost_found = match plan.lost_found {
            Some(inode) => inode,
            None => {
                let Some(slot) = plan.free_slot else {
                    let why = "no free inode for /lost+found".to_string();
                    return Err(RepairError::Stuck(why));
                };
                self.create_lost_found(slot, root)?;
                let entry = Named {
                    name: LOST_FOUND.to_vec(),
                    inode: slot,
                    file_type: FileType::Directory,
                    address: 0,
                };
                plan.edits.entry(root).or_default().add.push(entry.clone());
                plan.listings.entry(root).or_default().push(entry);
                *plan
                    .nlink
                    .entry(root)
                    .or_insert_with(|| plan.recorded_nlink.get(&root).copied().unwrap_or(2)) += 1;
                if plan.nlink.get(&root) == plan.recorded_nlink.get(&root) {
                    plan.nlink.remove(&root);
                }
                plan.sources.insert(slot, DirSource::Short(Vec::new()));
                plan.listings.insert(slot, Vec::new());
                self.action(format!("/lost+found: created as directory inode {slot}"));
                slot
            }
        };
        let mut subdirs = 0;
        for &(inode, file_type) in &plan.lost {
            let entry = Named {
                name: inode.to_string().into_bytes(),
                inode,
                file_type,
                address: 0,
            };
            plan.edits
                .entry(lost_found)
                .or_default()
                .add
                .push(entry.clone());
            plan.listings.entry(lost_found).or_default().push(entry);
            if file_type == FileType::Directory {
                subdirs += 1;
                plan.edits.entry(inode).or_default().parent = Some(lost_found);
            }
            self.action(format!(
                "inode {inode}: disconnected, moved to /lost+found/{inode}"
            ));
        }
        let current = plan.recorded_nlink.get(&lost_found).copied().unwrap_or(2);
        let base = plan.nlink.get(&lost_found).copied().unwrap_or(current);
        plan.nlink.insert(lost_found, base + subdirs);
        let entries = plan
            .listings
            .get(&lost_found)
            .map_or(&[][..], Vec::as_slice);
        let fits = match plan.sources.get(&lost_found) {
            Some(DirSource::Short(_)) => self.short_form_fits(lost_found, entries)?,
            _ => false,
        };
        if !fits {
            plan.rewrite.insert(lost_found);
        }
        Ok(())
    }

    /// Rewrites directory `dir` (parent `parent`) in block form, into new blocks, holding
    /// every entry of its listing.
    fn rewrite_directory(
        &mut self,
        dir: u64,
        parent: u64,
        plan: &mut NamePlan,
    ) -> Result<(), RepairError> {
        let entries = plan.listings.get(&dir).cloned().unwrap_or_default();
        let old_blocks = match plan.sources.get(&dir) {
            Some(DirSource::Blocks(extents)) => extents.iter().map(|e| u64::from(e.length)).sum(),
            _ => 0,
        };
        let extents =
            self.write_block_directory(dir, parent, &entries, old_blocks, &mut plan.source)?;
        plan.sources.insert(dir, DirSource::Blocks(extents));
        self.action(format!(
            "directory {dir}: rewritten in block form with {} entries",
            entries.len()
        ));
        Ok(())
    }

    fn create_lost_found(&mut self, inode: u64, root: u64) -> Result<(), RepairError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let stamp = Timestamp {
            seconds: now,
            nanoseconds: 0,
        };
        let dir = ShortformDir {
            parent: root,
            entries: Vec::new(),
        };
        let bytes = dir.encode()?;
        let core = InodeCore {
            header: MetaHeader::new(MetaKind::Inode, inode, self.uuid, inode),
            mode: FileType::Directory.mode_bits() | 0o700,
            data_format: ForkFormat::Local,
            attr_format: None,
            uid: 0,
            gid: 0,
            nlink: 2,
            generation: 1,
            flags: 0,
            size: bytes.len() as u64,
            block_count: 0,
            atime: stamp,
            mtime: stamp,
            ctime: stamp,
            btime: stamp,
            extent_size_hint: 0,
            next_unlinked: NULL_AG_INODE,
            data_extent_count: 0,
            attr_extent_count: 0,
            attr_offset: 0,
            rdev: 0,
            cow_extent_size_hint: 0,
            project_id: 0,
        };
        let mut literal = vec![0u8; self.geometry.inode_size as usize - INODE_CORE_SIZE];
        literal[..bytes.len()].copy_from_slice(&bytes);
        self.write_inode(inode, &core, &literal)
    }

    /// Makes directory `dir` an empty short-form directory whose parent is `parent`; its
    /// block count keeps only its attr fork's `attr_blocks`.
    fn empty_directory(
        &mut self,
        dir: u64,
        parent: u64,
        attr_blocks: u64,
    ) -> Result<(), RepairError> {
        let mut image = self.image(dir)?;
        let bytes = ShortformDir {
            parent,
            entries: Vec::new(),
        }
        .encode()?;
        let fork = image.data_fork_mut(self.geometry.inode_size);
        fork.fill(0);
        fork[..bytes.len()].copy_from_slice(&bytes);
        let core = &mut image.core;
        core.data_format = ForkFormat::Local;
        core.data_extent_count = 0;
        core.size = bytes.len() as u64;
        core.block_count = attr_blocks;
        self.write_image(dir, &image)
    }

    fn edit_directory(
        &mut self,
        dir: u64,
        source: &DirSource,
        edit: &DirEdit,
        entries: &[Named],
    ) -> Result<(), RepairError> {
        for (entry, why) in &edit.remove {
            let name = String::from_utf8_lossy(&entry.name);
            self.action(format!("directory {dir}: removed entry '{name}' ({why})"));
        }
        if let Some(parent) = edit.parent.filter(|&p| p != u64::MAX) {
            self.action(format!("directory {dir}: '..' set to {parent}"));
        }
        match source {
            DirSource::Short(_) => self.edit_short(dir, edit, entries),
            DirSource::Blocks(extents) => self.edit_blocks(dir, extents, edit),
        }
    }

    fn edit_short(
        &mut self,
        dir: u64,
        edit: &DirEdit,
        entries: &[Named],
    ) -> Result<(), RepairError> {
        let mut image = self.image(dir)?;
        let size = image.core.size as usize;
        let fork = image.data_fork_mut(self.geometry.inode_size);
        let old = ShortformDir::decode(fork.get(..size).unwrap_or_default()).ok();
        let room = fork.len();
        let mut sf = ShortformDir {
            parent: old
                .as_ref()
                .map_or(self.superblock.root_inode, |o| o.parent),
            entries: Vec::new(),
        };
        if let Some(parent) = edit.parent.filter(|&p| p != u64::MAX) {
            sf.parent = parent;
        }
        for entry in entries {
            let tag = next_tag(&sf, entry.name.len(), self.geometry.block_size);
            let keep_tag = old.as_ref().and_then(|o| {
                o.entries
                    .iter()
                    .find(|e| e.name == entry.name && e.inode == entry.inode)
                    .map(|e| e.tag)
            });
            let Some(tag) = keep_tag
                .filter(|&t| sf.entries.last().is_none_or(|l| l.tag < t))
                .or(tag)
            else {
                break;
            };
            sf.entries.push(ShortformEntry {
                tag,
                file_type: entry.file_type,
                inode: entry.inode,
                name: entry.name.clone(),
            });
        }
        let mut bytes = sf.encode()?;
        while bytes.len() > room {
            let Some(dropped) = sf.entries.pop() else {
                break;
            };
            let name = String::from_utf8_lossy(&dropped.name).into_owned();
            self.skipped
                .push(format!("directory {dir}: no room for entry '{name}'"));
            bytes = sf.encode()?;
        }
        let fork = image.data_fork_mut(self.geometry.inode_size);
        fork.fill(0);
        fork[..bytes.len()].copy_from_slice(&bytes);
        image.core.size = bytes.len() as u64;
        self.write_image(dir, &image)
    }

    /// Removes and adds entries in a block directory's data blocks and sets its parent marker.
    fn edit_blocks(
        &mut self,
        dir: u64,
        extents: &[Extent],
        edit: &DirEdit,
    ) -> Result<(), RepairError> {
        for (entry, _) in &edit.remove {
            let (index, offset) = split_dir_address(entry.address);
            let Some(at) = data_block(extents, u64::from(index)) else {
                continue;
            };
            let mut block = self.read_raw(at, 1)?;
            if dir_data_remove(&mut block, offset).is_ok() {
                self.write_meta(at, &mut block)?;
            }
        }
        for entry in &edit.add {
            let mut placed = false;
            for index in 0..data_blocks(extents) {
                let Some(at) = data_block(extents, index) else {
                    continue;
                };
                let mut block = self.read_raw(at, 1)?;
                if let Ok(Some(_)) =
                    dir_data_insert(&mut block, entry.inode, entry.file_type, &entry.name)
                {
                    self.write_meta(at, &mut block)?;
                    placed = true;
                    break;
                }
            }
            if !placed {
                let name = String::from_utf8_lossy(&entry.name).into_owned();
                self.skipped
                    .push(format!("directory {dir}: no room for entry '{name}'"));
            }
        }
        if let Some(parent) = edit.parent.filter(|&p| p != u64::MAX)
            && let Some(at) = data_block(extents, 0)
        {
            {
                let mut block = self.read_raw(at, 1)?;
                let marker = dir_data_entries(&block)?
                    .into_iter()
                    .find(|e| e.file_type == FileType::Unknown && e.name == b"..parent");
                if let Some(marker) = marker {
                    put_u64(&mut block, usize::from(marker.offset) + 2, parent);
                    self.write_meta(at, &mut block)?;
                }
            }
        }
        Ok(())
    }
}

impl Repairer<'_> {
    /// Writes an empty data block at `at` as data block `index` of directory `dir`; block 0
    /// gets the markers (`..parent` naming `parent`, and an `..index` the index rebuild sets).
    fn write_empty_dir_block(
        &mut self,
        at: u64,
        dir: u64,
        index: u64,
        parent: u64,
    ) -> Result<(), RepairError> {
        let mut block = vec![0u8; self.geometry.block_size as usize];
        let header = MetaHeader::new(MetaKind::DirData, at, self.uuid, dir);
        init_dir_data_block(&mut block, header)?;
        if index == 0 {
            let parent = if parent == u64::MAX {
                self.superblock.root_inode
            } else {
                parent
            };
            dir_data_insert(&mut block, parent, FileType::Unknown, b"..parent")?;
            dir_data_insert(&mut block, 1, FileType::Unknown, b"..index")?;
        }
        self.write_meta(at, &mut block)
    }
}

/// Index records for (hash, address) pairs: each under the first free key from its hash.
pub(super) fn probe_records(mut entries: Vec<(u32, u32)>) -> Vec<DirHashRecord> {
    entries.sort_unstable();
    let mut taken = BTreeSet::new();
    let mut records = Vec::with_capacity(entries.len());
    for (hash, address) in entries {
        let mut key = hash;
        while !taken.insert(key) {
            key = key.wrapping_add(1);
        }
        records.push(DirHashRecord { hash: key, address });
    }
    records.sort_by_key(|r| r.hash);
    records
}

/// The tag cairn-fs gives the next short-form entry (the address it would have in block form).
pub(super) fn next_tag(dir: &ShortformDir, name_len: usize, block_size: u32) -> Option<u16> {
    let needed = dir_entry_bytes(name_len);
    let position = match dir.entries.last() {
        None => FIRST_TAG,
        Some(last) => u32::from(last.tag) + (dir_entry_bytes(last.name.len()) / 8) as u32,
    };
    let (index, offset) = split_dir_address(position);
    let address = if usize::from(offset) + needed > block_size as usize {
        dir_address(index + 1, DIR_DATA_HEADER_SIZE as u16)?
    } else {
        position
    };
    u16::try_from(address).ok()
}

/// Data blocks (below the index range) a directory maps: one past the highest.
fn data_blocks(extents: &[Extent]) -> u64 {
    extents
        .iter()
        .filter(|e| e.file_block < INDEX_FILE_BASE)
        .map(|e| e.file_block + u64::from(e.length))
        .max()
        .unwrap_or(0)
}

/// Whether a directory's data fork maps every data block from 0 to its last, written (what
/// cairn-fs reads a block directory through).
fn data_blocks_complete(extents: &[Extent]) -> bool {
    let mut next = 0;
    for extent in extents.iter().filter(|e| e.file_block < INDEX_FILE_BASE) {
        if extent.file_block != next || extent.unwritten {
            return false;
        }
        next = extent.file_end();
    }
    next > 0
}

/// The filesystem block holding directory data block `index`.
fn data_block(extents: &[Extent], index: u64) -> Option<u64> {
    extents
        .iter()
        .find(|e| {
            e.file_block <= index && index < e.file_block + u64::from(e.length) && !e.unwritten
        })
        .map(|e| e.fs_block.0 + (index - e.file_block))
}

/// The directory whose entry for directory `child` is kept: the one its `..` names, if that
/// one names it, else the lowest.
fn chosen_parent(child: u64, names: &crate::namespace::Names) -> Option<u64> {
    let parents = names.parents.get(&child)?;
    let wanted = names.listings.get(&child).and_then(|l| l.parent);
    wanted
        .filter(|w| parents.contains(w))
        .or_else(|| parents.iter().min().copied())
}

/// The inodes reachable from `start` through `listings`.
fn reach(start: u64, listings: &BTreeMap<u64, Vec<Named>>) -> BTreeSet<u64> {
    let mut reached = BTreeSet::from([start]);
    let mut queue = vec![start];
    while let Some(dir) = queue.pop() {
        for entry in listings.get(&dir).map_or(&[][..], Vec::as_slice) {
            if reached.insert(entry.inode) && entry.file_type == FileType::Directory {
                queue.push(entry.inode);
            }
        }
    }
    reached
}

/// A free inode of an existing chunk (lowest first).
fn free_slot(survey: &Checker<'_>) -> Option<u64> {
    let g = survey.geometry;
    survey.findings.chunks.iter().find_map(|(ag, chunk)| {
        (0..64u32)
            .find(|slot| chunk.free_mask & (1 << slot) != 0)
            .map(|slot| (u64::from(*ag) << g.ag_inode_bits()) | u64::from(chunk.start + slot))
            .filter(|n| !survey.findings.broken_inodes.contains_key(n))
    })
}
