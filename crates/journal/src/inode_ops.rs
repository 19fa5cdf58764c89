//! The verifier of inode cluster buffers: blocks holding `block_size / inode_size` inodes, each
//! with its own header and CRC. The journal writes logged inode images into these buffers when
//! it pushes the AIL, so it owns their write path.

use cairn_bufcache::{BufferOps, ReadSpec};
use cairn_format::inode::free_inode_core;
use cairn_format::log::InodeCreate;
use cairn_format::{
    Expected, FormatError, FsBlock, Geometry, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk,
};

/// Writes into `slot` (one inode's bytes) the free inode `number` of `generation`: zeroed,
/// the free core encoded, CRC and `lsn` stamped. What a new cluster holds at creation and what
/// replay of its inode create item restores, so the two cannot differ.
pub(crate) fn write_free_inode(
    slot: &mut [u8],
    number: u64,
    uuid: [u8; 16],
    generation: u32,
    lsn: Lsn,
) {
    slot.fill(0);
    let header = MetaHeader::new(MetaKind::Inode, number, uuid, number);
    free_inode_core(header, generation).encode(slot);
    cairn_format::stamp(slot, Some(lsn));
}

/// Whether `create` describes the cluster starting at `block` of this geometry: the inode
/// size matches and every inode it names lives where the cluster places it.
pub(crate) fn create_fits(geometry: &Geometry, block: FsBlock, create: &InodeCreate) -> bool {
    let size = geometry.inode_size;
    let block_size = u64::from(geometry.block_size);
    create.inode_size == size
        && (0..create.inode_count()).all(|slot| {
            let at = u64::from(slot) * u64::from(size);
            let home = (
                FsBlock(block.0 + at / block_size),
                (at % block_size) as usize,
            );
            geometry.inode_position(InodeNumber(create.first_inode + u64::from(slot))) == Some(home)
        })
}

/// Verifier for inode cluster buffers of one inode size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeClusterOps {
    pub inode_size: u32,
}

static CLUSTER_256: InodeClusterOps = InodeClusterOps { inode_size: 256 };
static CLUSTER_512: InodeClusterOps = InodeClusterOps { inode_size: 512 };
static CLUSTER_1024: InodeClusterOps = InodeClusterOps { inode_size: 1024 };
static CLUSTER_2048: InodeClusterOps = InodeClusterOps { inode_size: 2048 };

/// The static verifier for `inode_size` (one of the sizes the format allows), or `None`.
pub fn inode_cluster_ops(inode_size: u32) -> Option<&'static InodeClusterOps> {
    match inode_size {
        256 => Some(&CLUSTER_256),
        512 => Some(&CLUSTER_512),
        1024 => Some(&CLUSTER_1024),
        2048 => Some(&CLUSTER_2048),
        _ => None,
    }
}

/// A read spec for inode cluster buffers of filesystem `uuid`.
pub fn inode_cluster_spec(inode_size: u32, uuid: [u8; 16]) -> Option<ReadSpec> {
    inode_cluster_ops(inode_size).map(|ops| ReadSpec::new(ops, uuid))
}

impl BufferOps for InodeClusterOps {
    fn name(&self) -> &'static str {
        "inode cluster"
    }

    /// Each slot must be an inode of this filesystem with a good CRC, numbered one past the
    /// slot before it.
    fn verify_read(&self, block: &[u8], at: FsBlock, spec: &ReadSpec) -> Result<(), FormatError> {
        let size = self.inode_size as usize;
        let mut first: Option<u64> = None;
        for (slot, raw) in block.chunks_exact(size).enumerate() {
            let header = MetaHeader::decode(raw)?;
            let number = first.map_or(header.blkno, |first| first + slot as u64);
            first.get_or_insert(header.blkno);
            let expected = Expected {
                kind: MetaKind::Inode,
                blkno: number,
                uuid: spec.uuid,
                owner: None,
            };
            cairn_format::verify_header(raw, &expected).map_err(|error| match error {
                FormatError::WrongBlock {
                    structure, found, ..
                } => FormatError::WrongBlock {
                    structure,
                    block: at.0,
                    found,
                },
                other => other,
            })?;
        }
        Ok(())
    }

    /// Recomputes each inode's CRC. Inode LSNs are set per inode by the journal when it copies
    /// a logged image in, so the buffer-wide `lsn` is not stamped here.
    fn prepare_write(
        &self,
        block: &mut [u8],
        at: FsBlock,
        _lsn: Option<Lsn>,
    ) -> Result<(), FormatError> {
        for raw in block.chunks_exact_mut(self.inode_size as usize) {
            let header = MetaHeader::decode(raw)?;
            if header.magic != MetaKind::Inode.magic() {
                return Err(FormatError::BadMagic {
                    structure: MetaKind::Inode.name(),
                    block: at.0,
                    expected: MetaKind::Inode.magic(),
                    found: header.magic,
                });
            }
            cairn_format::stamp(raw, None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(first: u64) -> Vec<u8> {
        let mut block = vec![0u8; 4096];
        for (slot, raw) in block.chunks_exact_mut(512).enumerate() {
            let number = first + slot as u64;
            MetaHeader::new(MetaKind::Inode, number, [4; 16], number).encode(raw);
            cairn_format::stamp(raw, Some(Lsn::new(1, 0)));
        }
        block
    }

    // Checks that free inodes written from a create item verify as a cluster.
    #[test]
    fn free_inodes_verify() {
        let ops = inode_cluster_ops(512).unwrap();
        let spec = inode_cluster_spec(512, [4; 16]).unwrap();
        let mut block = vec![0xffu8; 4096];
        for (slot, raw) in block.chunks_exact_mut(512).enumerate() {
            write_free_inode(raw, 80 + slot as u64, [4; 16], 9, Lsn::new(2, 8));
        }
        ops.verify_read(&block, FsBlock(10), &spec).unwrap();
        assert_eq!(
            MetaHeader::decode(&block[512..]).unwrap().lsn,
            Lsn::new(2, 8)
        );
        assert!(block[512 + 176..1024].iter().all(|&b| b == 0));
    }

    // Checks that a good cluster verifies, a changed one does not until rewritten.
    #[test]
    fn cluster_verify_and_stamp() {
        let ops = inode_cluster_ops(512).unwrap();
        assert!(inode_cluster_ops(300).is_none());
        let spec = inode_cluster_spec(512, [4; 16]).unwrap();
        let mut block = cluster(80);
        ops.verify_read(&block, FsBlock(10), &spec).unwrap();
        block[700] ^= 1;
        assert!(ops.verify_read(&block, FsBlock(10), &spec).is_err());
        ops.prepare_write(&mut block, FsBlock(10), None).unwrap();
        ops.verify_read(&block, FsBlock(10), &spec).unwrap();
        block[1024..1028].copy_from_slice(&[0; 4]);
        assert!(ops.prepare_write(&mut block, FsBlock(10), None).is_err());
        assert_eq!(ops.name(), "inode cluster");
    }
}
