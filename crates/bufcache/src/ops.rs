//! Verifiers: what a caller expects to read, and the per-kind checks run on read and write.

use std::fmt::Debug;

use cairn_format::{Expected, FormatError, FsBlock, Lsn, MetaHeader, MetaKind, OnDisk};

/// Largest reuse count a caller may give a buffer; larger values are clamped.
pub const LRU_REF_MAX: u32 = 8;

/// Per-kind verifier, stateless like XFS's buffer ops: one `static` per metadata kind.
///
/// `verify_read` runs once per read from disk (cache hits skip it); `prepare_write` runs once
/// per write-back, on the cached bytes, and must check the structure, then stamp the LSN, then
/// the CRC (so the CRC covers exactly what is written).
pub trait BufferOps: Send + Sync + Debug {
    /// Structure name for reports.
    fn name(&self) -> &'static str;

    /// Checks freshly read bytes of the buffer at `at` against what the reader expects.
    fn verify_read(&self, block: &[u8], at: FsBlock, spec: &ReadSpec) -> Result<(), FormatError>;

    /// Checks the bytes about to be written home at `at`, then stamps `lsn` and the CRC.
    fn prepare_write(
        &self,
        block: &mut [u8],
        at: FsBlock,
        lsn: Option<Lsn>,
    ) -> Result<(), FormatError>;

    /// The metadata kind, where the lock order depends on it (AG headers).
    fn kind(&self) -> Option<MetaKind> {
        None
    }
}

/// What a lookup expects, passed on every `get`; used only when the block is read from disk
/// (the verifier) or inserted (the verifier is remembered for write-back).
#[derive(Debug, Clone, Copy)]
pub struct ReadSpec {
    pub ops: &'static dyn BufferOps,
    /// Filesystem UUID every header must carry.
    pub uuid: [u8; 16],
    /// The owner (AG or inode number) when the reader knows it.
    pub owner: Option<u64>,
    /// Reuse count: how many reclaim passes the buffer survives at zero holds. AG headers and
    /// tree roots use higher values than one-shot blocks. Clamped to `LRU_REF_MAX`.
    pub lru_ref: u32,
}

impl ReadSpec {
    /// A spec with `lru_ref` 1 and no owner check.
    pub fn new(ops: &'static dyn BufferOps, uuid: [u8; 16]) -> Self {
        Self {
            ops,
            uuid,
            owner: None,
            lru_ref: 1,
        }
    }

    #[must_use]
    pub fn with_owner(mut self, owner: u64) -> Self {
        self.owner = Some(owner);
        self
    }

    #[must_use]
    pub fn with_lru_ref(mut self, lru_ref: u32) -> Self {
        self.lru_ref = lru_ref.min(LRU_REF_MAX);
        self
    }
}

/// The verifier for blocks that begin with the common header (`cairn_format::MetaHeader`):
/// reads check magic, CRC, own block, UUID and owner; writes check magic and own block (a
/// misdirected write is refused), then stamp. Structure-specific verifiers wrap this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderOps {
    pub kind: MetaKind,
}

impl HeaderOps {
    pub const fn new(kind: MetaKind) -> Self {
        Self { kind }
    }
}

impl BufferOps for HeaderOps {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn kind(&self) -> Option<MetaKind> {
        Some(self.kind)
    }

    fn verify_read(&self, block: &[u8], at: FsBlock, spec: &ReadSpec) -> Result<(), FormatError> {
        let expected = Expected {
            kind: self.kind,
            blkno: at.0,
            uuid: spec.uuid,
            owner: spec.owner,
        };
        cairn_format::verify_header(block, &expected).map(|_| ())
    }

    fn prepare_write(
        &self,
        block: &mut [u8],
        at: FsBlock,
        lsn: Option<Lsn>,
    ) -> Result<(), FormatError> {
        let header = MetaHeader::decode(block)?;
        let structure = self.kind.name();
        if header.magic != self.kind.magic() {
            return Err(FormatError::BadMagic {
                structure,
                block: at.0,
                expected: self.kind.magic(),
                found: header.magic,
            });
        }
        if header.blkno != at.0 {
            return Err(FormatError::WrongBlock {
                structure,
                block: at.0,
                found: header.blkno,
            });
        }
        cairn_format::stamp(block, lsn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::{HEADER_SIZE, block_lsn};

    static AGF: HeaderOps = HeaderOps::new(MetaKind::Agf);

    fn header_block(kind: MetaKind, blkno: u64) -> Vec<u8> {
        let mut block = vec![0u8; 512];
        MetaHeader::new(kind, blkno, [3; 16], 1).encode(&mut block[..HEADER_SIZE]);
        block
    }

    // Checks that prepare_write stamps LSN and CRC so the block then passes verify_read.
    #[test]
    fn prepared_block_verifies() {
        let mut block = header_block(MetaKind::Agf, 9);
        AGF.prepare_write(&mut block, FsBlock(9), Some(Lsn::new(1, 2)))
            .unwrap();
        assert_eq!(block_lsn(&block), Some(Lsn::new(1, 2)));
        let spec = ReadSpec::new(&AGF, [3; 16]).with_owner(1).with_lru_ref(99);
        assert_eq!(spec.lru_ref, LRU_REF_MAX);
        AGF.verify_read(&block, FsBlock(9), &spec).unwrap();
        let other = ReadSpec::new(&AGF, [3; 16]).with_owner(2);
        assert!(matches!(
            AGF.verify_read(&block, FsBlock(9), &other),
            Err(FormatError::WrongOwner { .. })
        ));
        assert_eq!(AGF.name(), MetaKind::Agf.name());
    }

    // Checks that the write check refuses another kind's block and a misdirected block.
    #[test]
    fn write_check_refuses_wrong_kind_and_address() {
        let mut agi = header_block(MetaKind::Agi, 9);
        assert!(matches!(
            AGF.prepare_write(&mut agi, FsBlock(9), None),
            Err(FormatError::BadMagic { .. })
        ));
        let mut misdirected = header_block(MetaKind::Agf, 9);
        assert!(matches!(
            AGF.prepare_write(&mut misdirected, FsBlock(10), None),
            Err(FormatError::WrongBlock { .. })
        ));
        assert!(matches!(
            AGF.prepare_write(&mut [0u8; 8], FsBlock(9), None),
            Err(FormatError::TooShort { .. })
        ));
    }
}
