//! The namespace: every directory is read from the root down; entries must name in-use
//! inodes of the type they say, each directory's `..` must be the one directory that names
//! it (and the root's itself), every in-use inode must be reachable from the root or on an
//! unlinked list, and link counts must equal the entries naming a file (2 + subdirectories
//! for a directory). Unlinked lists hold only in-use inodes without links, each once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cairn_blockdev::AlignedBuf;
use cairn_format::inode::{FileType, ForkFormat, InodeCore, local_bytes};
use cairn_format::limits::INODES_PER_CHUNK;
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{Extent, InodeNumber};

use crate::check::Checker;
use crate::dir_read::{DirSource, Listing, entry_name};
use crate::report::Problem;

/// Most members one unlinked bucket may hold before the list is called a cycle.
const UNLINKED_CHAIN_MAX: usize = 1 << 24;
/// Most entries naming unknown inodes that repair reads, looking for a chunk the inode trees
/// lost (a directory of dangling entries must not cost a read each).
const UNKNOWN_PROBES_MAX: usize = 256;

/// What the namespace phase needs of one in-use inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeSeen {
    pub file_type: FileType,
    pub block_count: u64,
    pub nlink: u32,
    pub next_unlinked: u32,
    /// `INODE_FLAG_*` bits.
    pub flags: u32,
    /// Directories only: where the entries are.
    pub dir: Option<DirSource>,
}

/// Who names whom, gathered from every readable directory.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub listings: BTreeMap<u64, Listing>,
    /// Entries naming each inode.
    pub references: HashMap<u64, u32>,
    /// Directories naming each directory.
    pub parents: HashMap<u64, Vec<u64>>,
    /// What each directory holds, as it reads (short form or extents).
    pub sources: BTreeMap<u64, DirSource>,
}

impl Checker<'_> {
    /// Records an in-use inode for the namespace phase (called by the chunk walk).
    pub(crate) fn note_inode(&mut self, number: InodeNumber, raw: &[u8], core: &InodeCore) {
        let Some(file_type) = core.file_type() else {
            return;
        };
        let dir = (file_type == FileType::Directory).then(|| match core.data_format {
            ForkFormat::Local => {
                let fork = &raw[core.data_fork_range(self.geometry.inode_size)];
                DirSource::Short(local_bytes(fork, core.size).unwrap_or_default().to_vec())
            }
            _ => DirSource::Blocks(Vec::new()),
        });
        let seen = InodeSeen {
            file_type,
            block_count: core.block_count,
            nlink: core.nlink,
            next_unlinked: core.next_unlinked,
            flags: core.flags,
            dir,
        };
        self.inodes.insert(number.0, seen);
    }

    /// Records the data fork extents of a block-form directory, and a regular file's extent
    /// count (called by the fork walk).
    pub(crate) fn note_directory_extents(&mut self, number: InodeNumber, extents: &[Extent]) {
        let regular = self
            .inodes
            .get(&number.0)
            .is_some_and(|seen| seen.file_type == FileType::Regular);
        if regular && !extents.is_empty() {
            let count = extents
                .windows(2)
                .filter(|pair| pair[0].fs_end() != pair[1].fs_block)
                .count()
                + 1;
            self.file_extent_counts.push((number.0, count as u64));
        }
        if let Some(InodeSeen {
            dir: Some(DirSource::Blocks(list)),
            ..
        }) = self.inodes.get_mut(&number.0)
        {
            list.clone_from(&extents.to_vec());
        }
    }

    /// Runs the namespace checks over what the chunk walk recorded.
    pub(crate) fn check_namespace(&mut self) {
        let problems = self.report.problems.len();
        let root = self.superblock.root_inode;
        let names = self.gather_names();
        if self.repairing && !self.scan_all {
            self.findings.unknown_chunks = self.names_unknown_chunk(&names);
        }
        self.check_entries(&names);
        self.check_parents(root, &names);
        let unlinked = self.walk_unlinked_lists(&names);
        let reached = reachable(root, &names);
        self.check_connected(&names, &reached, &unlinked);
        self.check_link_counts(&names, &unlinked);
        if self.repairing {
            self.findings.names = names;
            self.findings.unlinked = unlinked;
            self.findings.namespace_problems = self.report.problems.len() - problems;
        }
    }

    fn gather_names(&mut self) -> Names {
        let mut names = Names::default();
        let dirs: Vec<(u64, DirSource)> = self
            .inodes
            .iter()
            .filter_map(|(&number, seen)| seen.dir.clone().map(|source| (number, source)))
            .collect();
        for (dir, source) in dirs {
            let Some(mut listing) = self.read_directory(dir, &source) else {
                continue;
            };
            if let DirSource::Blocks(extents) = &source {
                let records = self.check_dir_index(dir, extents, &listing);
                self.check_duplicate_names(dir, &mut listing, records.as_deref());
            }
            names.sources.insert(dir, source);
            for entry in &listing.entries {
                *names.references.entry(entry.inode).or_default() += 1;
                if entry.file_type == FileType::Directory {
                    names.parents.entry(entry.inode).or_default().push(dir);
                }
            }
            names.listings.insert(dir, listing);
        }
        names
    }

    /// Every entry names an in-use inode of the type the entry records.
    fn check_entries(&mut self, names: &Names) {
        for (&dir, listing) in &names.listings {
            for entry in &listing.entries {
                let message = match self.inodes.get(&entry.inode) {
                    None => format!(
                        "entry '{}' names inode {}, which is not in use",
                        entry_name(entry),
                        entry.inode
                    ),
                    Some(seen) if seen.file_type != entry.file_type => format!(
                        "entry '{}' says {:?}, inode {} is {:?}",
                        entry_name(entry),
                        entry.file_type,
                        entry.inode,
                        seen.file_type
                    ),
                    Some(_) => continue,
                };
                self.dir_problem(dir, None, message);
            }
        }
    }

    /// No directory has two parents, and each `..` names the directory's one parent.
    fn check_parents(&mut self, root: u64, names: &Names) {
        for (&dir, listing) in &names.listings {
            let named_by = names.parents.get(&dir).map_or(&[][..], Vec::as_slice);
            if named_by.len() > 1 {
                let message = format!("is named by {} entries: {named_by:?}", named_by.len());
                self.dir_problem(dir, None, message);
            }
            let expected = if dir == root {
                Some(root)
            } else {
                named_by.first().copied()
            };
            if let (Some(expected), Some(parent)) = (expected, listing.parent)
                && parent != expected
            {
                let message = format!("'..' is {parent}, but its parent is {expected}");
                self.dir_problem(dir, None, message);
            }
        }
    }

    /// Walks every AG's unlinked buckets; returns the members found.
    fn walk_unlinked_lists(&mut self, names: &Names) -> BTreeSet<u64> {
        let mut members = BTreeSet::new();
        let heads = std::mem::take(&mut self.unlinked_heads);
        for (ag, buckets) in &heads {
            for (bucket, &head) in buckets.iter().enumerate() {
                self.walk_bucket(*ag, bucket, head, names, &mut members);
            }
        }
        self.unlinked_heads = heads;
        members
    }

    fn walk_bucket(
        &mut self,
        ag: u32,
        bucket: usize,
        head: u32,
        names: &Names,
        members: &mut BTreeSet<u64>,
    ) {
        let mut next = head;
        let mut steps = 0;
        let mut walked = Vec::new();
        while next != NULL_AG_INODE && steps < UNLINKED_CHAIN_MAX {
            steps += 1;
            let number = (u64::from(ag) << self.geometry.ag_inode_bits()) | u64::from(next);
            let twice = !members.insert(number);
            if !twice {
                walked.push(number);
            }
            let problem = match self.inodes.get(&number) {
                _ if twice => Some("is on an unlinked list twice"),
                None => Some("is on an unlinked list but not in use"),
                Some(seen) if seen.nlink != 0 => Some("is on an unlinked list but has links"),
                Some(_) if names.references.contains_key(&number) => {
                    Some("is on an unlinked list but a directory names it")
                }
                Some(_) => None,
            };
            if let Some(problem) = problem {
                let message = format!("AG {ag} bucket {bucket}: inode {number} {problem}");
                self.report
                    .add(Problem::new("unlinked list", Some(number), message));
                if self.repairing {
                    // Repair empties the bucket (as xfs_repair does); its members, with no
                    // link and no list, are then orphans and freed.
                    self.findings.broken_buckets.insert((ag, bucket));
                    for member in walked {
                        members.remove(&member);
                    }
                }
                return;
            }
            next = self
                .inodes
                .get(&number)
                .map_or(NULL_AG_INODE, |s| s.next_unlinked);
        }
    }
}

impl Checker<'_> {
    /// Every in-use inode is reachable from the root or on an unlinked list. A file named
    /// only by unreachable directories is left to its directory's report.
    fn check_connected(
        &mut self,
        names: &Names,
        reached: &BTreeSet<u64>,
        unlinked: &BTreeSet<u64>,
    ) {
        let lost: Vec<(u64, FileType)> = self
            .inodes
            .iter()
            .filter(|(number, _)| !reached.contains(number) && !unlinked.contains(number))
            .map(|(&number, seen)| (number, seen.file_type))
            .collect();
        for (number, file_type) in lost {
            let message = if file_type == FileType::Directory {
                format!("directory {number} is not reachable from the root")
            } else if !names.references.contains_key(&number) {
                format!("inode {number} ({file_type:?}) is in use but no directory names it")
            } else {
                continue;
            };
            self.report
                .add(Problem::new("connectivity", Some(number), message));
        }
    }

    /// Link counts: entries naming a file; 2 + subdirectories for a directory; 0 on an
    /// unlinked list (checked by the list walk).
    fn check_link_counts(&mut self, names: &Names, unlinked: &BTreeSet<u64>) {
        let mut wrong = Vec::new();
        for (&number, seen) in &self.inodes {
            if unlinked.contains(&number) {
                continue;
            }
            let expected = if seen.file_type == FileType::Directory {
                let Some(listing) = names.listings.get(&number) else {
                    continue;
                };
                let subdirs = listing
                    .entries
                    .iter()
                    .filter(|e| e.file_type == FileType::Directory)
                    .count();
                2 + subdirs as u32
            } else {
                names.references.get(&number).copied().unwrap_or(0)
            };
            if seen.nlink != expected || expected == 0 {
                wrong.push((number, seen.nlink, expected));
            }
        }
        for (number, found, expected) in wrong {
            if self.repairing && expected > 0 {
                self.findings.wrong_nlink.insert(number, expected);
            }
            let message = if expected == 0 {
                format!("inode {number} has no links but is not on an unlinked list")
            } else {
                format!("inode {number} has link count {found}, expected {expected}")
            };
            self.report
                .add(Problem::new("link count", Some(number), message));
        }
    }
}

/// The inodes reachable from the root through readable directories.
fn reachable(root: u64, names: &Names) -> BTreeSet<u64> {
    let mut reached = BTreeSet::from([root]);
    let mut queue = vec![root];
    while let Some(dir) = queue.pop() {
        let Some(listing) = names.listings.get(&dir) else {
            continue;
        };
        for entry in &listing.entries {
            if reached.insert(entry.inode) && entry.file_type == FileType::Directory {
                queue.push(entry.inode);
            }
        }
    }
    reached
}

impl Checker<'_> {
    /// Whether an entry names an inode outside every chunk the inode trees gave that
    /// verifies and is in use: the trees lost its chunk, and a survey must scan for chunks.
    fn names_unknown_chunk(&self, names: &Names) -> bool {
        let g = self.geometry;
        let known: BTreeSet<(u32, u32)> = self
            .findings
            .chunks
            .iter()
            .map(|(ag, chunk)| (*ag, chunk.start))
            .collect();
        let dangling = names
            .listings
            .values()
            .flat_map(|listing| &listing.entries)
            .filter(|entry| !self.inodes.contains_key(&entry.inode))
            .take(UNKNOWN_PROBES_MAX);
        dangling.into_iter().any(|entry| {
            let Some((ag, block, slot)) = g.inode_location(InodeNumber(entry.inode)) else {
                return false;
            };
            let start = ((block.0 << g.inodes_per_block_log) + slot) & !(INODES_PER_CHUNK - 1);
            !known.contains(&(ag.0, start)) && self.inode_in_use(entry.inode)
        })
    }

    /// Whether inode `number` verifies and is in use, read straight from the device.
    fn inode_in_use(&self, number: u64) -> bool {
        let g = self.geometry;
        let Some((at, offset)) = g.inode_position(InodeNumber(number)) else {
            return false;
        };
        let mut buf = AlignedBuf::zeroed(g.block_size as usize);
        let expected = self.inode_expected(number);
        self.device.read_at(g.byte_offset(at), &mut buf).is_ok()
            && InodeCore::read(&buf[offset..offset + g.inode_size as usize], &expected)
                .is_ok_and(|core| core.file_type().is_some())
    }
}
