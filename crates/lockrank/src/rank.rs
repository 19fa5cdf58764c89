//! The ranks: every lock class of cairn, outermost first, and how each nests.

/// A lock class. A thread takes locks in ascending rank: it never waits for a lock of a
/// lower rank than one it holds (with the exceptions `Rank::is_transparent_to` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rank {
    /// The filesystem-wide rename lock (only rename changes a directory's ancestry).
    Rename = 10,
    /// A per-inode I/O lock (shared for reads, exclusive for size and mapping changes).
    InodeIo = 20,
    /// The metadata lock of a directory whose entries the holder reads or changes: parents
    /// come before the inodes their entries name.
    DirInode = 30,
    /// The metadata lock of an inode in its own right (an entry's inode, a file being read,
    /// written or freed).
    Inode = 40,
    /// Not a lock: waiting for log space. A thread holding a buffer may pin the log's tail,
    /// so it must not wait for space (`check_may_wait`).
    LogSpace = 50,
    /// An AG header buffer: every AGI before every AGF, each kind by ascending AG (XFS's
    /// order). The key is `ag` for an AGI and `ag_count + ag` for an AGF.
    AgHeader = 60,
    /// An AG's in-memory allocator state (busy extents), held only under its AGF.
    AllocAg = 65,
    /// Any other metadata buffer. Each is protected by a lock above it (its inode's lock, or
    /// its AG's header), so buffers nest in any order and do not order the AG headers.
    Buffer = 70,
    /// An AG's in-memory unlinked lists, changed only under its AGI.
    UnlinkedIndex = 75,
    /// A per-inode extent status tree.
    ExtentTree = 80,
    /// The filesystem's map of extent-tree handles.
    ExtentHandles = 85,
    /// The journal's AIL push serialisation.
    JournalPush = 100,
    /// The journal's synchronous-commit serialisation (`logmode=sync`).
    JournalSyncCommit = 105,
    /// The committed item list.
    JournalCil = 110,
    /// The log writer.
    JournalWriter = 120,
    /// The active item list.
    JournalAil = 130,
    /// Log space accounting (grant head, head and tail).
    JournalSpace = 140,
    /// The journal's completion counter.
    JournalCompleted = 145,
    /// The journal's shutdown reason and background worker state.
    JournalState = 150,
    /// The inode cache's map; its holder may look at (not wait for) an inode's home buffer.
    InodeCache = 185,
    /// The buffer cache's reclaim serialisation.
    BufferReclaim = 190,
    /// The buffer cache's per-AG index.
    BufferIndex = 200,
    /// The buffer cache's LRU and delayed-write queue.
    BufferLists = 210,
    /// A lock whose holder takes no other ranked lock (caches' maps, counters).
    Leaf = 250,
}

/// How locks of one rank nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// One at a time.
    Single,
    /// Several, each key above every held key of the rank.
    Ascending,
    /// Several in any order: a lock above them keeps them apart.
    Any,
    /// Several, each further one naming its rule (`Order::Declared`).
    Declared,
}

impl Rank {
    /// How locks of this rank nest.
    pub const fn nesting(self) -> Nesting {
        match self {
            Rank::InodeIo | Rank::DirInode | Rank::Inode => Nesting::Declared,
            Rank::AgHeader => Nesting::Ascending,
            Rank::Buffer | Rank::ExtentTree | Rank::BufferIndex => Nesting::Any,
            _ => Nesting::Single,
        }
    }

    /// Whether a held lock of this rank puts no order on acquiring `next`. A buffer is
    /// protected by its owner's lock or its AG's header, so holding one says nothing about
    /// when another AG's header or allocator state may be taken: the headers' own ascending
    /// order does.
    pub const fn is_transparent_to(self, next: Rank) -> bool {
        matches!((self, next), (Rank::Buffer, Rank::AgHeader | Rank::AllocAg))
    }
}
