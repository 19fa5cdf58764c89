//! Attribute forks: the short form is decoded and checked; an Extents attr fork must map one
//! written leaf block at attr block 0, which is read, verified (kind, own address, owner =
//! the inode, UUID, CRC) and decoded, and its remote values' blocks checked against the
//! device's end. A Btree attr fork (index form) holds the index root: the index tree is
//! walked (verifier, levels, siblings, keys strictly increasing), and its records must name
//! exactly the attributes of the leaves they point at (each leaf checked as above, each
//! attribute under its name's hash, once); the fill leaf must be one of them. The tree, leaf
//! and remote blocks are claimed; their number is the attr fork's share of the inode's block
//! count. Attributes of the System namespace must be valid POSIX ACLs
//! (`system.posix_acl_access`, and `system.posix_acl_default` on directories only).

use std::collections::BTreeMap;

use cairn_format::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME, Acl};
use cairn_format::dir::name_hash;
use cairn_format::inode::{FileType, ForkFormat, InodeCore, fork_extents};
use cairn_format::xattr::{
    Namespace, XattrIndexRecord, XattrIndexRoot, XattrLeaf, XattrValue, decode_shortform_xattrs,
};
use cairn_format::{Expected, FsBlock, InodeNumber, MetaKind, OnDisk, verify_header};

use crate::check::Checker;
use crate::report::Problem;

impl Checker<'_> {
    fn attr_problem(&mut self, number: InodeNumber, block: Option<u64>, message: String) {
        self.findings.broken_attr.insert(number.0);
        self.report.add(Problem::new(
            "attribute fork",
            block.or(Some(number.0)),
            format!("inode {number}: {message}"),
        ));
    }

    /// Checks the attr fork of an in-use inode, claims its blocks and returns how many.
    pub(crate) fn check_attr_fork(
        &mut self,
        number: InodeNumber,
        raw: &[u8],
        core: &InodeCore,
    ) -> u64 {
        let Some(range) = core.attr_fork_range(self.geometry.inode_size) else {
            return 0;
        };
        let fork = &raw[range];
        match core.attr_format {
            Some(ForkFormat::Local) => {
                match decode_shortform_xattrs(fork) {
                    Ok(attrs) => {
                        for attr in attrs.iter().filter(|a| a.namespace == Namespace::System) {
                            self.check_system_attr(number, None, &attr.name, &attr.value, core);
                        }
                    }
                    Err(err) => self.attr_problem(number, None, err.to_string()),
                }
                0
            }
            Some(ForkFormat::Extents) => self.check_attr_leaf(number, fork, core),
            Some(ForkFormat::Btree) => self.check_attr_index(number, fork, core),
            other => {
                let message = format!("unsupported attr fork format {other:?}");
                self.attr_problem(number, None, message);
                0
            }
        }
    }

    fn check_attr_leaf(&mut self, number: InodeNumber, fork: &[u8], core: &InodeCore) -> u64 {
        let extents = match fork_extents(fork, u32::from(core.attr_extent_count)) {
            Ok(extents) => extents,
            Err(err) => {
                self.attr_problem(number, None, err.to_string());
                return 0;
            }
        };
        let leaf = match extents.as_slice() {
            [e] if e.file_block == 0
                && e.length == 1
                && !e.unwritten
                && e.fs_block.0 < self.geometry.block_count =>
            {
                e.fs_block.0
            }
            _ => {
                let message = "the attr fork does not map one leaf block".to_string();
                self.attr_problem(number, None, message);
                return 0;
            }
        };
        if self.repairing {
            self.findings.attr_leaves.insert(number.0, vec![leaf]);
        }
        self.check_leaf_block(number, leaf, core)
            .map_or(1, |(_, blocks)| blocks)
    }

    /// Reads and checks leaf block `leaf` of inode `number` and the remote values it points
    /// at, and claims them if it verifies; returns it decoded (unless it failed its checks)
    /// and the blocks claimed.
    fn check_leaf_block(
        &mut self,
        number: InodeNumber,
        leaf: u64,
        core: &InodeCore,
    ) -> Option<(XattrLeaf, u64)> {
        let Some(block) = self.read_block(FsBlock(leaf), MetaKind::AttrBlock.name()) else {
            self.findings.broken_attr.insert(number.0);
            return None;
        };
        let expected = Expected {
            kind: MetaKind::AttrBlock,
            blkno: leaf,
            uuid: self.uuid,
            owner: Some(number.0),
        };
        let decoded =
            verify_header(&block, &expected).and_then(|_| XattrLeaf::decode_block(&block));
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(err) => {
                self.findings.broken_attr.insert(number.0);
                self.report.add(Problem::from_format(leaf, &err));
                return None;
            }
        };
        // Claimed only once it verifies: a record or fork damaged to name another
        // structure's block must not take it from its owner.
        self.claim_for(number.0, leaf, 1, "xattr leaf");
        let mut blocks = 1;
        let block_size = self.geometry.block_size;
        for entry in &decoded.entries {
            let system = entry.namespace == Namespace::System;
            let (block, length) = match &entry.value {
                XattrValue::Local(value) if system => {
                    self.check_system_attr(number, Some(leaf), &entry.name, value, core);
                    continue;
                }
                XattrValue::Local(_) => continue,
                XattrValue::Remote { block, length } => (*block, *length),
            };
            let count = u64::from(length.div_ceil(block_size).max(1));
            if block.0.saturating_add(count) > self.geometry.block_count {
                let message = format!("remote value at block {} ends past the device", block.0);
                self.attr_problem(number, Some(leaf), message);
                continue;
            }
            self.claim_for(number.0, block.0, count, "xattr value");
            blocks += count;
            if system && let Some(raw) = self.read_blocks(block, count as u32, "xattr value") {
                let value = &raw[..length as usize];
                self.check_system_attr(number, Some(leaf), &entry.name, value, core);
            }
        }
        Some((decoded, blocks))
    }

    /// The index form: the tree, then every leaf its records point at (see the module
    /// documentation).
    fn check_attr_index(&mut self, number: InodeNumber, fork: &[u8], core: &InodeCore) -> u64 {
        let root = match XattrIndexRoot::decode(fork) {
            Ok(root) => root,
            Err(err) => {
                self.attr_problem(number, None, err.to_string());
                return 0;
            }
        };
        if self.repairing {
            self.findings
                .attr_leaves
                .insert(number.0, root.fill.iter().map(|fill| fill.0).collect());
        }
        let walked = self.walk_file_tree::<XattrIndexRecord>(
            MetaKind::AttrBtree,
            number.0,
            (root.root.0, root.levels),
            |this, owner, block, message| this.attr_problem(InodeNumber(owner), block, message),
        );
        let Some((records, tree_blocks)) = walked else {
            self.findings.broken_attr.insert(number.0);
            return 0;
        };
        for &block in &tree_blocks {
            self.claim_for(number.0, block, 1, "xattr index tree");
        }
        if self.repairing {
            let blocks = tree_blocks.iter().copied().collect();
            self.findings.attr_tree_blocks.insert(number.0, blocks);
        }
        if records
            .windows(2)
            .any(|pair| pair[0].key() >= pair[1].key())
        {
            let message = "index records are not in strictly increasing key order".to_string();
            self.attr_problem(number, None, message);
        }
        let mut by_leaf: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for record in &records {
            by_leaf.entry(record.leaf.0).or_default().push(record.hash);
        }
        if self.repairing
            && let Some(leaves) = self.findings.attr_leaves.get_mut(&number.0)
        {
            leaves.extend(by_leaf.keys());
        }
        if let Some(fill) = root.fill.filter(|fill| !by_leaf.contains_key(&fill.0)) {
            let message = format!("the fill leaf {} is not one of the index's leaves", fill.0);
            self.attr_problem(number, None, message);
        }
        let mut blocks = tree_blocks.len() as u64;
        for (leaf, mut hashes) in by_leaf {
            let Some((decoded, claimed)) = self.check_leaf_block(number, leaf, core) else {
                blocks += 1;
                continue;
            };
            blocks += claimed;
            let mut names: Vec<u32> = decoded.entries.iter().map(|e| name_hash(&e.name)).collect();
            names.sort_unstable();
            hashes.sort_unstable();
            if names != hashes {
                let message = format!(
                    "leaf {leaf} holds {} attributes, the index names {} there (or other hashes)",
                    names.len(),
                    hashes.len()
                );
                self.attr_problem(number, Some(leaf), message);
            }
        }
        blocks
    }

    /// An attribute of the System namespace must be a POSIX ACL: `posix_acl_access`, or
    /// `posix_acl_default` on a directory, holding a valid list.
    fn check_system_attr(
        &mut self,
        number: InodeNumber,
        block: Option<u64>,
        name: &[u8],
        value: &[u8],
        core: &InodeCore,
    ) {
        let is_dir = core.file_type() == Some(FileType::Directory);
        if let Some(fault) = system_attr_fault(name, value, is_dir) {
            self.attr_problem(number, block, fault);
        }
    }

    /// An inode whose data fork holds no blocks (Local or Device) counts its attr blocks only.
    pub(crate) fn check_unmapped_block_count(
        &mut self,
        number: InodeNumber,
        core: &InodeCore,
        attr_blocks: u64,
    ) {
        let unmapped = matches!(core.data_format, ForkFormat::Local | ForkFormat::Device);
        if unmapped && core.block_count != attr_blocks {
            if self.repairing {
                self.findings.wrong_counts.insert(number.0, 0);
            }
            let message = format!(
                "inode {number}: block count is {}, its attr fork holds {attr_blocks}",
                core.block_count
            );
            self.report
                .add(Problem::new("inode", Some(number.0), message));
        }
    }
}

/// Why an attribute of the System namespace named `name` (the part after `system.`) with
/// `value` is not a valid POSIX ACL of its inode (`is_dir`: the inode is a directory), or
/// `None` if it is one.
pub(crate) fn system_attr_fault(name: &[u8], value: &[u8], is_dir: bool) -> Option<String> {
    let shown = String::from_utf8_lossy(name).into_owned();
    let message = if name == ACL_DEFAULT_NAME && !is_dir {
        "a default ACL on something other than a directory".to_string()
    } else if name != ACL_ACCESS_NAME && name != ACL_DEFAULT_NAME {
        "not a POSIX ACL name".to_string()
    } else {
        Acl::decode(value).err()?.to_string()
    };
    Some(format!("system.{shown}: {message}"))
}
