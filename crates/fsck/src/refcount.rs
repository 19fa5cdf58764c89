//! Shared blocks (reflink). Each AG's refcount tree is walked (its blocks claimed, their
//! count checked against the AGF), its records checked (inside the AG, in order, disjoint,
//! touching runs of equal count merged); staging runs are leftovers of a copy-on-write a
//! crash interrupted, reported (mount or repair frees them) and claimed so their blocks
//! are not reported lost as well. Once every file's data is claimed (`check_shared`), the
//! counts are checked against the sum of all regular files' mappings: a block mapped by
//! more than one extent has a record of exactly that count, no other block has one, and
//! every file that maps a shared block carries `INODE_FLAG_REFLINK`.

use std::collections::{BTreeMap, BTreeSet};

use cairn_format::agf::Agf;
use cairn_format::inode::{FileType, INODE_FLAG_REFLINK};
use cairn_format::{FsBlock, MetaKind, OnDisk, RefcountRecord};

use crate::check::{Checker, Claim};
use crate::report::Problem;
use crate::tree::AgTree;

/// Owner of the blocks staging records name.
pub(crate) const STAGING_OWNER: &str = "copy-on-write staging";

/// What the refcount trees said, gathered AG by AG.
#[derive(Debug, Default)]
pub(crate) struct RefcountSeen {
    /// Shared runs as filesystem blocks `(start, end, count)`, in order.
    pub shared: Vec<(u64, u64, u32)>,
    /// AGs whose tree could not be read: their counts are not compared.
    pub unreadable: BTreeSet<u32>,
}

/// A run of filesystem blocks `start..end` mapped `count` times.
type Run = (u64, u64, u32);

impl Checker<'_> {
    /// Checks AG `ag`'s refcount tree, if the AGF roots one.
    pub(crate) fn check_refcount_tree(&mut self, ag: u32, agf: &Agf) {
        if !agf.has_refcount_tree() {
            return;
        }
        let at = Some(agf.header.blkno);
        if !self.superblock.has_reflink() {
            let message = format!("AG {ag} roots a refcount tree without the reflink feature");
            self.report
                .add(Problem::new(MetaKind::Agf.name(), at, message));
            self.refcounts.unreadable.insert(ag);
            return;
        }
        let tree = AgTree {
            kind: MetaKind::RefcountBtree,
            ag,
            root: agf.refcount_root,
            levels: agf.refcount_levels,
        };
        let claimed = self.claims.len();
        let Some(raw) = self.walk_ag_tree(tree) else {
            self.refcounts.unreadable.insert(ag);
            return;
        };
        let blocks = self.claims.len() - claimed;
        if blocks as u64 != u64::from(agf.refcount_blocks) {
            let message = format!(
                "refcount_blocks is {}, the tree holds {blocks}",
                agf.refcount_blocks
            );
            self.report
                .add(Problem::new(MetaKind::Agf.name(), at, message));
        }
        let records = self.refcount_records(ag, &raw);
        self.check_refcount_runs(ag, &records);
    }

    /// Decodes a refcount tree's records, reporting those that do not decode or lie
    /// outside the AG.
    fn refcount_records(&mut self, ag: u32, raw: &[Vec<u8>]) -> Vec<RefcountRecord> {
        let name = MetaKind::RefcountBtree.name();
        let ag_len = self.geometry.ag_len(ag);
        let mut records = Vec::with_capacity(raw.len());
        for bytes in raw {
            match RefcountRecord::decode(bytes).and_then(|r| r.check(0, ag_len).map(|()| r)) {
                Ok(record) => records.push(record),
                Err(err) => {
                    self.report
                        .add(Problem::new(name, None, format!("AG {ag}: {err}")));
                    self.refcounts.unreadable.insert(ag);
                }
            }
        }
        records
    }

    /// Checks order, overlap and merging within each kind; notes shared runs, reports and
    /// claims staging runs.
    fn check_refcount_runs(&mut self, ag: u32, records: &[RefcountRecord]) {
        let name = MetaKind::RefcountBtree.name();
        for pair in records.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.staging != b.staging {
                continue;
            }
            if a.end() > u64::from(b.start.0) {
                let message = format!(
                    "AG {ag}: records at {} and {} overlap",
                    a.start.0, b.start.0
                );
                self.report.add(Problem::new(name, None, message));
                self.refcounts.unreadable.insert(ag);
            } else if a.end() == u64::from(b.start.0) && a.refcount == b.refcount {
                let message = format!(
                    "AG {ag}: records at {} and {} touch with equal counts (not merged)",
                    a.start.0, b.start.0
                );
                self.report.add(Problem::new(name, None, message));
            }
        }
        let base = self.geometry.ag_start(ag);
        for record in records {
            let start = base + u64::from(record.start.0);
            let end = base + record.end();
            if record.staging {
                let message =
                    format!("blocks {start}..{end}: copy-on-write staging blocks left by a crash");
                self.report.add(Problem::new(name, Some(start), message));
                self.claim(start, end - start, STAGING_OWNER);
            } else {
                self.refcounts.shared.push((start, end, record.refcount));
            }
        }
    }

    /// Whether `claim` may be shared with other files: a regular file's data.
    pub(crate) fn shareable(&self, claim: &Claim) -> bool {
        claim.owner == "file data"
            && claim.inode.is_some_and(|inode| {
                self.inodes
                    .get(&inode)
                    .is_some_and(|seen| seen.file_type == FileType::Regular)
            })
    }

    /// Checks the refcount trees against `data`, every regular file's data claim (sorted by
    /// start): the runs mapped more than once must be exactly the trees' shared records,
    /// and the files mapping them must carry the reflink flag.
    pub(crate) fn check_shared(&mut self, data: &[&Claim]) {
        let mapped = mapping_counts(data);
        let multiple: Vec<Run> = mapped.iter().copied().filter(|r| r.2 >= 2).collect();
        let recorded = std::mem::take(&mut self.refcounts.shared);
        let unreadable = &self.refcounts.unreadable;
        let g = self.geometry;
        let judged = |start: u64| !unreadable.contains(&g.ag_of(FsBlock(start)).0);
        let differences: Vec<(u64, u64, u32, u32)> = compare_runs(&multiple, &recorded)
            .into_iter()
            .filter(|d| judged(d.0))
            .collect();
        for (start, end, tree, files) in differences {
            let message = format!(
                "blocks {start}..{end}: the refcount tree counts {tree}, files map them \
                 {files} times"
            );
            let name = MetaKind::RefcountBtree.name();
            self.report.add(Problem::new(name, Some(start), message));
        }
        self.refcounts.shared = recorded;
        let mut flagless = BTreeSet::new();
        for claim in data {
            let Some(inode) = claim.inode else { continue };
            let end = claim.start + claim.length;
            let index = multiple.partition_point(|r| r.1 <= claim.start);
            let shares = multiple.get(index).is_some_and(|r| r.0 < end);
            let flagged = self
                .inodes
                .get(&inode)
                .is_some_and(|seen| seen.flags & INODE_FLAG_REFLINK != 0);
            if shares && !flagged {
                flagless.insert(inode);
            }
        }
        for inode in flagless {
            let message = format!("inode {inode} maps shared blocks without the reflink flag");
            self.report.add(Problem::new("inode", Some(inode), message));
            if self.repairing {
                self.findings.missing_reflink.insert(inode);
            }
        }
    }
}

/// The runs of blocks the claims map, with how many claims map each (sorted, touching runs
/// of equal count merged).
pub(crate) fn mapping_counts(data: &[&Claim]) -> Vec<Run> {
    let mut deltas: BTreeMap<u64, i64> = BTreeMap::new();
    for claim in data {
        *deltas.entry(claim.start).or_default() += 1;
        *deltas.entry(claim.start + claim.length).or_default() -= 1;
    }
    let mut runs: Vec<Run> = Vec::new();
    let mut count = 0i64;
    let mut from = 0u64;
    for (&at, &delta) in &deltas {
        if count > 0 && at > from {
            push_run(&mut runs, (from, at, count as u32));
        }
        count += delta;
        from = at;
    }
    runs
}

fn push_run(runs: &mut Vec<Run>, run: Run) {
    match runs.last_mut() {
        Some(last) if last.1 == run.0 && last.2 == run.2 => last.1 = run.1,
        _ => runs.push(run),
    }
}

/// Where two sorted run lists disagree: `(start, end, count in a, count in b)`, counting
/// blocks that a run list leaves out as 1 (mapped once or free: the difference is in
/// blocks mapped more than once, or recorded as such).
fn compare_runs(files: &[Run], tree: &[Run]) -> Vec<(u64, u64, u32, u32)> {
    let mut bounds: BTreeSet<u64> = BTreeSet::new();
    for run in files.iter().chain(tree) {
        bounds.insert(run.0);
        bounds.insert(run.1);
    }
    let count_at = |runs: &[Run], block: u64| {
        let index = runs.partition_point(|r| r.1 <= block);
        runs.get(index).filter(|r| r.0 <= block).map_or(1, |r| r.2)
    };
    let bounds: Vec<u64> = bounds.into_iter().collect();
    let mut out: Vec<(u64, u64, u32, u32)> = Vec::new();
    for pair in bounds.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let (in_tree, in_files) = (count_at(tree, a), count_at(files, a));
        if in_tree == in_files {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == a && last.2 == in_tree && last.3 == in_files => last.1 = b,
            _ => out.push((a, b, in_tree, in_files)),
        }
    }
    out
}

/// The shared records an AG's rebuilt tree holds: runs of `data` (regular files' claims)
/// mapped more than once, cut at AG boundaries, as records of each AG.
pub(crate) fn rebuilt_records(
    geometry: &cairn_format::Geometry,
    data: &[&Claim],
) -> BTreeMap<u32, Vec<RefcountRecord>> {
    let mut per_ag: BTreeMap<u32, Vec<RefcountRecord>> = BTreeMap::new();
    for (start, end, count) in mapping_counts(data) {
        if count < 2 {
            continue;
        }
        let mut at = start;
        while at < end {
            let ag = geometry.ag_of(FsBlock(at)).0;
            let ag_end = geometry.ag_start(ag) + u64::from(geometry.ag_len(ag));
            let stop = end.min(ag_end);
            per_ag.entry(ag).or_default().push(RefcountRecord {
                start: geometry.ag_block_of(FsBlock(at)),
                length: (stop - at) as u32,
                refcount: count,
                staging: false,
            });
            at = stop;
        }
    }
    per_ag
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(start: u64, length: u64, inode: u64) -> Claim {
        Claim {
            start,
            length,
            owner: "file data",
            inode: Some(inode),
        }
    }

    // Checks the counting: overlapping claims give runs of their multiplicity, merged
    // where touching runs count the same; and the comparison names each differing run.
    #[test]
    fn counts_and_comparison() {
        let claims = [
            claim(10, 10, 1),
            claim(10, 5, 2),
            claim(15, 5, 3),
            claim(30, 4, 4),
        ];
        let refs: Vec<&Claim> = claims.iter().collect();
        let counts = mapping_counts(&refs);
        assert_eq!(counts, vec![(10, 20, 2), (30, 34, 1)]);
        let tree = [(10, 15, 2), (15, 18, 3)];
        let diff = compare_runs(&[(10, 20, 2)], &tree);
        assert_eq!(diff, vec![(15, 18, 3, 2), (18, 20, 1, 2)]);
        assert!(compare_runs(&[(10, 20, 2)], &[(10, 20, 2)]).is_empty());
    }
}
