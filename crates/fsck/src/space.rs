//! Free space: both free-space trees of an AG hold the same merged extents, and the AGF's
//! counters describe them exactly.

use cairn_format::agf::Agf;
use cairn_format::btree_block::FreeSpaceRecord;
use cairn_format::{AgNumber, MetaKind, OnDisk};

use crate::check::Checker;
use crate::report::Problem;
use crate::tree::AgTree;

impl Checker<'_> {
    /// Checks AG `ag`'s free-space trees against each other and the AGF; returns the free
    /// blocks the by-block tree holds.
    pub fn check_free_space(&mut self, ag: u32, agf: &Agf) -> u64 {
        let bno = AgTree {
            kind: MetaKind::BnoBtree,
            ag,
            root: agf.bno_root,
            levels: agf.bno_levels,
        };
        let cnt = AgTree {
            kind: MetaKind::CntBtree,
            ag,
            root: agf.cnt_root,
            levels: agf.cnt_levels,
        };
        let by_block = self
            .walk_ag_tree(bno)
            .map(|r| self.free_records(ag, MetaKind::BnoBtree, &r));
        let by_length = self
            .walk_ag_tree(cnt)
            .map(|r| self.free_records(ag, MetaKind::CntBtree, &r));
        let Some(by_block) = by_block else { return 0 };
        self.check_merged(ag, &by_block);
        let free: u64 = by_block.iter().map(|r| u64::from(r.length)).sum();
        let longest = by_block.iter().map(|r| r.length).max().unwrap_or(0);
        let at = Some(agf.header.blkno);
        if u64::from(agf.free_blocks) != free {
            let message = format!("free_blocks is {}, the trees hold {free}", agf.free_blocks);
            self.report
                .add(Problem::new(MetaKind::Agf.name(), at, message));
        }
        if agf.longest_free != longest {
            let message = format!(
                "longest_free is {}, the trees hold {longest}",
                agf.longest_free
            );
            self.report
                .add(Problem::new(MetaKind::Agf.name(), at, message));
        }
        if let Some(mut by_length) = by_length {
            by_length.sort();
            if by_length != by_block {
                let message = format!(
                    "AG {ag}: the by-length tree holds other extents than the by-block tree"
                );
                self.report
                    .add(Problem::new(MetaKind::CntBtree.name(), None, message));
            }
        }
        for record in &by_block {
            let start = self.geometry.fs_block(AgNumber(ag), record.start);
            self.claim(start.0, u64::from(record.length), "free space");
        }
        self.report.free_extents += by_block.len() as u64;
        free
    }

    fn free_records(&mut self, ag: u32, kind: MetaKind, raw: &[Vec<u8>]) -> Vec<FreeSpaceRecord> {
        let ag_len = self.geometry.ag_len(ag);
        let mut records = Vec::with_capacity(raw.len());
        for bytes in raw {
            match FreeSpaceRecord::decode(bytes)
                .and_then(|r| r.check(self.geometry.ag_start(ag), ag_len).map(|()| r))
            {
                Ok(record) => records.push(record),
                Err(err) => {
                    let message = format!("AG {ag}: {err}");
                    self.report.add(Problem::new(kind.name(), None, message));
                }
            }
        }
        records
    }

    /// Free extents never overlap or touch: touching ones must have been merged.
    fn check_merged(&mut self, ag: u32, by_block: &[FreeSpaceRecord]) {
        for pair in by_block.windows(2) {
            let end = u64::from(pair[0].start.0) + u64::from(pair[0].length);
            let next = u64::from(pair[1].start.0);
            if end >= next {
                let what = if end == next {
                    "touch (not merged)"
                } else {
                    "overlap"
                };
                let message = format!(
                    "AG {ag}: free extents at {} and {} {what}",
                    pair[0].start.0, pair[1].start.0
                );
                self.report
                    .add(Problem::new(MetaKind::BnoBtree.name(), None, message));
            }
        }
    }
}
