//! The superblock: filesystem geometry, features and summary counters. The primary copy is
//! block 0 of AG 0; every AG starts with a copy (owner = AG number, blkno = its own block).
//!
//! Layout after the 48-byte header (little-endian):
//!
//! | offset | size | field               |
//! |--------|------|---------------------|
//! | 48     | 4    | version (1)         |
//! | 52     | 4    | block_size          |
//! | 56     | 4    | sector_size         |
//! | 60     | 4    | inode_size          |
//! | 64     | 8    | block_count         |
//! | 72     | 4    | ag_blocks           |
//! | 76     | 4    | ag_count            |
//! | 80     | 8    | log_start (FsBlock) |
//! | 88     | 4    | log_blocks          |
//! | 92     | 4    | reserved (zero)     |
//! | 96     | 8    | features_compat     |
//! | 104    | 8    | features_ro_compat  |
//! | 112    | 8    | features_incompat   |
//! | 120    | 8    | root_inode          |
//! | 128    | 8    | free_blocks         |
//! | 136    | 8    | inode_count         |
//! | 144    | 8    | free_inodes         |
//! | 152    | 32   | label (NUL padded)  |
//! | 184    | 8    | created (unix s)    |
//! | 192    | 4    | default extent size hint (blocks, 0 = none) |
//! | 196    | 60   | reserved (zero)     |

use crate::FormatError;
use crate::geometry::Geometry;
use crate::header::{Expected, MetaHeader, MetaKind, verify_header};
use crate::limits::LABEL_LEN_MAX;
use crate::ondisk::{
    OnDisk, check_zero, get_bytes, get_i64, get_u32, get_u64, need, put_bytes, put_i64, put_u32,
    put_u64,
};

pub const FORMAT_VERSION: u32 = 1;
/// Shared extents (reflink): every AGF may root a reference-count tree (`refcount.rs`),
/// inodes may carry `INODE_FLAG_REFLINK` and a CoW extent size hint, and the log may hold
/// refcount intent and done items. Code without it would free shared blocks (and refuses
/// the fields besides), so the bit is incompatible.
pub const FEATURE_INCOMPAT_REFLINK: u64 = 1 << 0;
/// Feature bits this build understands. Unknown incompat bits refuse the mount; unknown
/// ro-compat bits allow only a read-only mount; unknown compat bits are ignored.
pub const FEATURES_INCOMPAT_KNOWN: u64 = FEATURE_INCOMPAT_REFLINK;
pub const FEATURES_RO_COMPAT_KNOWN: u64 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub header: MetaHeader,
    pub geometry: Geometry,
    pub features_compat: u64,
    pub features_ro_compat: u64,
    pub features_incompat: u64,
    pub root_inode: u64,
    pub free_blocks: u64,
    pub inode_count: u64,
    pub free_inodes: u64,
    pub label: [u8; LABEL_LEN_MAX],
    pub created_secs: i64,
    pub extent_size_hint: u32,
}

impl Superblock {
    pub fn uuid(&self) -> [u8; 16] {
        self.header.uuid
    }

    /// The label as text, up to its first NUL.
    pub fn label_str(&self) -> String {
        let end = self
            .label
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(LABEL_LEN_MAX);
        String::from_utf8_lossy(&self.label[..end]).into_owned()
    }

    /// Whether files may share blocks (`FEATURE_INCOMPAT_REFLINK`).
    pub fn has_reflink(&self) -> bool {
        self.features_incompat & FEATURE_INCOMPAT_REFLINK != 0
    }

    /// Ro-compat features this build does not know; non-zero means mount read-only.
    pub fn unknown_ro_compat(&self) -> u64 {
        self.features_ro_compat & !FEATURES_RO_COMPAT_KNOWN
    }

    /// The copy of this superblock that lives at the start of AG `ag`.
    pub fn copy_for_ag(&self, ag: u32) -> Superblock {
        let mut copy = self.clone();
        copy.header.blkno = self.geometry.ag_start(ag);
        copy.header.owner = u64::from(ag);
        copy
    }

    /// Verifies and decodes the primary superblock from `head`, the first bytes of the device
    /// (at least one block; the block size is not known before reading). The UUID is taken from
    /// the block itself, and trusted only after magic and CRC have passed.
    pub fn read_primary(head: &[u8]) -> Result<Superblock, FormatError> {
        let unverified = Self::decode(head).map_err(|err| match MetaHeader::decode(head) {
            // A wrong magic says more ("not a cairn filesystem") than a field check of garbage.
            Ok(h) if h.magic != MetaKind::Superblock.magic() => FormatError::BadMagic {
                structure: Self::NAME,
                block: 0,
                expected: MetaKind::Superblock.magic(),
                found: h.magic,
            },
            _ => err,
        })?;
        let block_size = unverified.geometry.block_size as usize;
        need(Self::NAME, head, block_size)?;
        let uuid = unverified.header.uuid;
        let expected = Expected {
            kind: MetaKind::Superblock,
            blkno: 0,
            uuid,
            owner: Some(0),
        };
        Self::read(&head[..block_size], &expected)
    }

    /// Verifies the header of one whole block against `expected`, then decodes and validates
    /// the body.
    pub fn read(block: &[u8], expected: &Expected) -> Result<Superblock, FormatError> {
        verify_header(block, expected)?;
        let sb = Self::decode(block)?;
        check_zero(
            Self::NAME,
            sb.header.blkno,
            "block tail",
            block,
            Self::SIZE..block.len(),
        )?;
        Ok(sb)
    }
}

impl OnDisk for Superblock {
    const SIZE: usize = 256;
    const NAME: &'static str = "superblock";

    fn encode(&self, out: &mut [u8]) {
        let g = &self.geometry;
        self.header.encode(out);
        put_u32(out, 48, FORMAT_VERSION);
        put_u32(out, 52, g.block_size);
        put_u32(out, 56, g.sector_size);
        put_u32(out, 60, g.inode_size);
        put_u64(out, 64, g.block_count);
        put_u32(out, 72, g.ag_blocks);
        put_u32(out, 76, g.ag_count);
        put_u64(out, 80, g.log_start);
        put_u32(out, 88, g.log_blocks);
        put_u32(out, 92, 0);
        put_u64(out, 96, self.features_compat);
        put_u64(out, 104, self.features_ro_compat);
        put_u64(out, 112, self.features_incompat);
        put_u64(out, 120, self.root_inode);
        put_u64(out, 128, self.free_blocks);
        put_u64(out, 136, self.inode_count);
        put_u64(out, 144, self.free_inodes);
        put_bytes(out, 152, &self.label);
        put_i64(out, 184, self.created_secs);
        put_u32(out, 192, self.extent_size_hint);
        out[196..Self::SIZE].fill(0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let header = MetaHeader::decode(raw)?;
        let bad = |field, value: u64, why| FormatError::BadField {
            structure: Self::NAME,
            block: header.blkno,
            field,
            value,
            why,
        };
        let version = get_u32(raw, 48);
        if version != FORMAT_VERSION {
            return Err(bad(
                "version",
                u64::from(version),
                "unsupported format version",
            ));
        }
        let features_incompat = get_u64(raw, 112);
        let unknown = features_incompat & !FEATURES_INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(FormatError::UnsupportedFeatures {
                structure: Self::NAME,
                block: header.blkno,
                features: unknown,
            });
        }
        let geometry = Geometry::new(
            get_u32(raw, 52),
            get_u32(raw, 56),
            get_u32(raw, 60),
            get_u64(raw, 64),
            get_u32(raw, 72),
            get_u64(raw, 80),
            get_u32(raw, 88),
        )
        .map_err(|(field, value, why)| bad(field, value, why))?;
        if get_u32(raw, 76) != geometry.ag_count {
            return Err(bad(
                "ag_count",
                u64::from(get_u32(raw, 76)),
                "disagrees with block counts",
            ));
        }
        check_zero(Self::NAME, header.blkno, "reserved", raw, 92..96)?;
        check_zero(Self::NAME, header.blkno, "reserved", raw, 196..Self::SIZE)?;
        let root_inode = get_u64(raw, 120);
        if !geometry.inode_is_valid(root_inode) {
            return Err(bad("root_inode", root_inode, "outside the filesystem"));
        }
        Ok(Self {
            header,
            geometry,
            features_compat: get_u64(raw, 96),
            features_ro_compat: get_u64(raw, 104),
            features_incompat,
            root_inode,
            free_blocks: get_u64(raw, 128),
            inode_count: get_u64(raw, 136),
            free_inodes: get_u64(raw, 144),
            label: get_bytes::<LABEL_LEN_MAX>(raw, 152),
            created_secs: get_i64(raw, 184),
            extent_size_hint: get_u32(raw, 192),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::stamp;
    use crate::types::Lsn;

    fn sample_block() -> Vec<u8> {
        let geometry = Geometry::new(4096, 512, 512, 262_144, 65_536, 16, 2048).unwrap();
        let sb = Superblock {
            header: MetaHeader::new(MetaKind::Superblock, 0, [5; 16], 0),
            geometry,
            features_compat: 1,
            features_ro_compat: 0,
            features_incompat: 0,
            root_inode: geometry
                .inode_number(crate::AgNumber(0), crate::AgBlock(16), 0)
                .0,
            free_blocks: 1000,
            inode_count: 64,
            free_inodes: 63,
            label: [b'x'; LABEL_LEN_MAX],
            created_secs: 1_700_000_000,
            extent_size_hint: 16,
        };
        let mut block = vec![0u8; 8192];
        sb.encode(&mut block);
        stamp(&mut block[..4096], Some(Lsn::ZERO));
        block
    }

    proptest::proptest! {
        // Encoding then decoding gives the same superblock, for any geometry that validates.
        #[test]
        fn superblock_round_trip(
            block_log in 9u32..17,
            ag_count in 1u64..8,
            counters: (u64, u64, u64),
            features_compat: u64,
            label: [u8; LABEL_LEN_MAX],
            created_secs: i64,
            extent_size_hint: u32,
            reflink: bool,
        ) {
            let block_size = 1u32 << block_log;
            let inode_size = (block_size / 64).clamp(256, 2048).min(block_size);
            let ag_blocks = 4096u32;
            let geometry = Geometry::new(
                block_size, 512, inode_size, ag_count * 4096, ag_blocks, 64, 64,
            ).unwrap();
            let sb = Superblock {
                header: MetaHeader::new(MetaKind::Superblock, 0, [7; 16], 0),
                geometry,
                features_compat,
                features_ro_compat: 0,
                features_incompat: if reflink { FEATURE_INCOMPAT_REFLINK } else { 0 },
                root_inode: geometry.inode_number(crate::AgNumber(0), crate::AgBlock(8), 0).0,
                free_blocks: counters.0,
                inode_count: counters.1,
                free_inodes: counters.2,
                label,
                created_secs,
                extent_size_hint,
            };
            proptest::prop_assert_eq!(Superblock::decode(&sb.to_bytes()).unwrap(), sb);
        }

        // Decoding arbitrary bytes gives a superblock or an error, never a panic.
        #[test]
        fn random_bytes_never_panic(raw in proptest::collection::vec(0u8..=255, 0..300)) {
            let _ = Superblock::decode(&raw);
            let _ = Superblock::read_primary(&raw);
        }
    }

    // Checks that the primary superblock is found in a head longer than one block.
    #[test]
    fn primary_reads_from_a_longer_head() {
        let head = sample_block();
        let sb = Superblock::read_primary(&head).unwrap();
        assert_eq!(sb.geometry.block_size, 4096);
        assert_eq!(sb.uuid(), [5; 16]);
        assert_eq!(sb.label_str().len(), LABEL_LEN_MAX);
        assert_eq!(sb.copy_for_ag(2).header.blkno, 131_072);
    }

    // Checks that the reserved bytes and the rest of the block must be zero (CRC intact).
    #[test]
    fn nonzero_reserved_bytes_are_refused() {
        for at in [92, 200, 255, 256, 4095] {
            let mut head = sample_block();
            head[at] = 1;
            stamp(&mut head[..4096], None);
            assert!(
                matches!(
                    Superblock::read_primary(&head),
                    Err(FormatError::BadField { value, .. }) if value == at as u64
                ),
                "byte {at} accepted"
            );
        }
    }

    // Checks that an incompatible feature this build does not know refuses the superblock,
    // naming the unknown bits, while the known reflink bit reads.
    #[test]
    fn unknown_incompat_features_are_refused() {
        let mut head = sample_block();
        put_u64(&mut head, 112, FEATURE_INCOMPAT_REFLINK);
        stamp(&mut head[..4096], None);
        assert!(Superblock::read_primary(&head).unwrap().has_reflink());
        put_u64(&mut head, 112, FEATURE_INCOMPAT_REFLINK | 1 << 5);
        stamp(&mut head[..4096], None);
        assert!(matches!(
            Superblock::read_primary(&head),
            Err(FormatError::UnsupportedFeatures { features: 32, .. })
        ));
    }

    // Checks the errors for a flipped byte, a short head and something that is not cairn.
    #[test]
    fn primary_refusals() {
        let mut head = sample_block();
        head[300] ^= 1;
        assert!(matches!(
            Superblock::read_primary(&head),
            Err(FormatError::BadCrc { .. })
        ));
        let head = sample_block();
        assert!(matches!(
            Superblock::read_primary(&head[..1024]),
            Err(FormatError::TooShort { .. })
        ));
        let mut head = sample_block();
        head[..4].copy_from_slice(b"XFSB");
        assert!(matches!(
            Superblock::read_primary(&head),
            Err(FormatError::BadMagic { .. })
        ));
        assert!(Superblock::read_primary(&[0u8; 100]).is_err());
    }
}
