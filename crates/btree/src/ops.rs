//! Buffer verifiers for tree blocks: the common header checks, then the node header.

use cairn_bufcache::{BufferOps, HeaderOps, ReadSpec};
use cairn_format::{BtreeHeader, BtreeLayout, FormatError, FsBlock, Lsn, MetaKind, OnDisk};

/// The verifier of one tree kind. Stateless: it checks what a single block can show (header,
/// level, count against capacity); relations between blocks are the tree's and `verify`'s job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtreeOps {
    header: HeaderOps,
}

impl BtreeOps {
    pub const fn new(kind: MetaKind) -> Self {
        Self {
            header: HeaderOps::new(kind),
        }
    }

    fn check_node(&self, block: &[u8], at: FsBlock) -> Result<(), FormatError> {
        let header = BtreeHeader::decode(block)?;
        let kind = self.header.kind;
        let layout =
            BtreeLayout::for_kind(kind, block.len() as u32).ok_or(FormatError::BadField {
                structure: kind.name(),
                block: at.0,
                field: "magic",
                value: u64::from(kind.magic()),
                why: "not a B+tree kind",
            })?;
        header.check(&layout, block, 0..u64::MAX)
    }
}

impl BufferOps for BtreeOps {
    fn name(&self) -> &'static str {
        self.header.name()
    }

    fn verify_read(&self, block: &[u8], at: FsBlock, spec: &ReadSpec) -> Result<(), FormatError> {
        self.header.verify_read(block, at, spec)?;
        self.check_node(block, at)
    }

    fn prepare_write(
        &self,
        block: &mut [u8],
        at: FsBlock,
        lsn: Option<Lsn>,
    ) -> Result<(), FormatError> {
        self.check_node(block, at)?;
        self.header.prepare_write(block, at, lsn)
    }
}

static BNO_OPS: BtreeOps = BtreeOps::new(MetaKind::BnoBtree);
static CNT_OPS: BtreeOps = BtreeOps::new(MetaKind::CntBtree);
static INO_OPS: BtreeOps = BtreeOps::new(MetaKind::InoBtree);
static FINO_OPS: BtreeOps = BtreeOps::new(MetaKind::FinoBtree);
static BMAP_OPS: BtreeOps = BtreeOps::new(MetaKind::BmapBtree);
static DIR_OPS: BtreeOps = BtreeOps::new(MetaKind::DirBtree);
static ATTR_OPS: BtreeOps = BtreeOps::new(MetaKind::AttrBtree);
static REFCOUNT_OPS: BtreeOps = BtreeOps::new(MetaKind::RefcountBtree);

/// The verifier of tree kind `kind`, or `None` if `kind` is not a B+tree kind.
pub fn ops_for(kind: MetaKind) -> Option<&'static BtreeOps> {
    match kind {
        MetaKind::BnoBtree => Some(&BNO_OPS),
        MetaKind::CntBtree => Some(&CNT_OPS),
        MetaKind::InoBtree => Some(&INO_OPS),
        MetaKind::FinoBtree => Some(&FINO_OPS),
        MetaKind::BmapBtree => Some(&BMAP_OPS),
        MetaKind::DirBtree => Some(&DIR_OPS),
        MetaKind::AttrBtree => Some(&ATTR_OPS),
        MetaKind::RefcountBtree => Some(&REFCOUNT_OPS),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::types::NULL_BLOCK;
    use cairn_format::{MetaHeader, OnDisk};

    // Checks that a stamped leaf verifies and that an over-full count is refused on read
    // and on write.
    #[test]
    fn verifier_checks_node_header() {
        let ops = ops_for(MetaKind::BnoBtree).unwrap();
        assert!(ops_for(MetaKind::Agf).is_none());
        let mut block = vec![0u8; 512];
        let mut header = BtreeHeader {
            header: MetaHeader::new(MetaKind::BnoBtree, 7, [1; 16], 0),
            level: 0,
            record_count: 3,
            left: NULL_BLOCK,
            right: NULL_BLOCK,
        };
        header.encode(&mut block);
        ops.prepare_write(&mut block, FsBlock(7), Some(Lsn(5)))
            .unwrap();
        let spec = ReadSpec::new(ops, [1; 16]).with_owner(0);
        ops.verify_read(&block, FsBlock(7), &spec).unwrap();
        header.record_count = 1000;
        header.encode(&mut block);
        assert!(ops.prepare_write(&mut block, FsBlock(7), None).is_err());
        assert!(ops.verify_read(&block, FsBlock(7), &spec).is_err());
        assert_eq!(ops.name(), MetaKind::BnoBtree.name());
    }
}
