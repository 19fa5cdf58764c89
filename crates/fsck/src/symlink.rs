//! Remote symlink blocks: a symlink whose target does not fit in the inode keeps it in blocks
//! of its data fork, one piece per block. Each block must verify (magic, CRC, own block
//! number, filesystem UUID, owner = the symlink) and the pieces must follow each other
//! (offsets in order, full blocks but the last) and add up to the inode's size.
//!
//! Repair: when every piece decodes in place and the target holds no NUL byte, the target is
//! salvaged and only the damaged block headers are rewritten; otherwise the symlink inode is
//! cleared (its entry is then removed as dangling).

use cairn_format::inode::InodeCore;
use cairn_format::limits::SYMLINK_LEN_MAX;
use cairn_format::symlink::{decode_symlink_block, symlink_block_capacity};
use cairn_format::{Expected, Extent, FsBlock, InodeNumber, MetaKind, verify_header};

use crate::check::Checker;
use crate::report::Problem;

/// What one symlink block turned out to be.
enum Piece {
    /// Verifies and sits where it should.
    Good,
    /// Its header does not verify, but its piece decodes in place (salvageable).
    BadHeader,
    /// Missing, unreadable or not the piece that belongs there.
    Lost,
}

impl Checker<'_> {
    /// Checks the remote target blocks of symlink `number` mapped by `extents`.
    pub(crate) fn check_symlink_blocks(
        &mut self,
        number: InodeNumber,
        core: &InodeCore,
        extents: &[Extent],
    ) {
        let what = MetaKind::SymlinkBlock.name();
        let capacity = symlink_block_capacity(self.geometry.block_size) as u64;
        if core.size == 0 || core.size > SYMLINK_LEN_MAX as u64 || capacity == 0 {
            let message = format!("symlink {number}: target length {} is invalid", core.size);
            self.report
                .add(Problem::new("inode", Some(number.0), message));
            return self.lose_symlink(number, "its target length is invalid");
        }
        let needed = core.size.div_ceil(capacity);
        let mapped: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
        if mapped > needed {
            // cairn-fs reads every block the map holds as a piece of the target.
            let message =
                format!("symlink {number}: maps {mapped} blocks, its target needs {needed}");
            self.report.add(Problem::new(what, None, message));
            if self.repairing {
                self.findings.rebuild_map.insert(number.0);
                self.findings.trim_map.insert(number.0, needed);
            }
        }
        let mut salvage = Vec::new();
        let mut lost = false;
        for index in 0..needed {
            let offset = index * capacity;
            let length = capacity.min(core.size - offset);
            let Some(at) = mapped_block(extents, index, self.geometry.block_count) else {
                let message = format!("symlink {number}: block {index} of its target is missing");
                self.report.add(Problem::new(what, None, message));
                lost = true;
                continue;
            };
            match self.check_symlink_piece(number, at, offset, length) {
                Piece::Good => {}
                Piece::BadHeader => salvage.push(at),
                Piece::Lost => lost = true,
            }
        }
        if lost {
            self.lose_symlink(number, "its target cannot be read");
        } else if self.repairing {
            let pairs = salvage.into_iter().map(|at| (at, number.0));
            self.findings.restamp_symlink_blocks.extend(pairs);
        }
    }

    /// Checks one target block: its header, then that it holds `length` bytes of the target
    /// from `offset`, none of them NUL.
    fn check_symlink_piece(
        &mut self,
        number: InodeNumber,
        at: u64,
        offset: u64,
        length: u64,
    ) -> Piece {
        let what = MetaKind::SymlinkBlock.name();
        let Some(block) = self.read_block(FsBlock(at), what) else {
            return Piece::Lost;
        };
        let expected = Expected {
            kind: MetaKind::SymlinkBlock,
            blkno: at,
            uuid: self.uuid,
            owner: Some(number.0),
        };
        let header = verify_header(&block, &expected);
        if let Err(err) = &header {
            self.report.add(Problem::from_format(at, err));
        }
        let fits = match decode_symlink_block(&block) {
            Ok((piece, target)) => {
                u64::from(piece.offset) == offset
                    && u64::from(piece.length) == length
                    && !target.contains(&0)
            }
            Err(_) => false,
        };
        match (header.is_ok(), fits) {
            (true, true) => Piece::Good,
            (false, true) => Piece::BadHeader,
            (header_ok, false) => {
                if header_ok {
                    let message = format!(
                        "symlink {number}: block does not hold bytes {offset}..{} of its \
                         target",
                        offset + length
                    );
                    self.report.add(Problem::new(what, Some(at), message));
                }
                Piece::Lost
            }
        }
    }

    fn lose_symlink(&mut self, number: InodeNumber, why: &str) {
        if self.repairing {
            self.findings
                .broken_inodes
                .insert(number.0, why.to_string());
        }
    }
}

/// The filesystem block holding file block `index`, if mapped inside the device.
fn mapped_block(extents: &[Extent], index: u64, block_count: u64) -> Option<u64> {
    extents
        .iter()
        .find(|e| e.file_block <= index && index < e.file_end() && !e.unwritten)
        .map(|e| e.fs_block.0 + (index - e.file_block))
        .filter(|&at| at < block_count)
}
