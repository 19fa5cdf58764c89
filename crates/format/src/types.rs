//! Newtypes for addresses whose mixing would corrupt the disk.

use std::fmt;

macro_rules! newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

newtype!(
    /// Index of an allocation group.
    AgNumber(u32)
);
newtype!(
    /// Block number relative to the start of its allocation group.
    AgBlock(u32)
);
newtype!(
    /// Filesystem block number: `ag_number * ag_blocks + ag_block` (linear, so the byte
    /// offset of a block is `fs_block * block_size`).
    FsBlock(u64)
);
newtype!(
    /// Inode number: `(ag_number << ag_inode_bits) | (ag_block << inodes_per_block_log) | slot`.
    InodeNumber(u64)
);
newtype!(
    /// Log sequence number: `(cycle << 32) | log block offset`. Zero means "never logged".
    Lsn(u64)
);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn new(cycle: u32, block: u32) -> Self {
        Lsn((u64::from(cycle) << 32) | u64::from(block))
    }

    pub fn cycle(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub fn block(self) -> u32 {
        self.0 as u32
    }
}

/// Marker for "no block" in sibling pointers and empty roots.
pub const NULL_BLOCK: u64 = u64::MAX;
/// Marker for "no inode" in unlinked lists.
pub const NULL_AG_INODE: u32 = u32::MAX;
/// Marker for "no AG block" in AG free-list slots.
pub const NULL_AG_BLOCK: u32 = u32::MAX;
