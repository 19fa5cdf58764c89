//! Synthetic metadata traces shaped like what an XFS-style filesystem does per file create and
//! per unlink, for measuring lookaside hit rates (`benches/bufcache.rs` and the crate's tests).
//!
//! Shape (per AG, one parent directory per AG, files spread round robin over the directories):
//! - fixed blocks: AGF 1, AGI 2, AGFL 3, free-space roots 4 and 5, inode tree roots 6 and 7,
//!   the parent directory's inode cluster at 8 (2 blocks), its extent-tree block 10, its
//!   directory hash-tree root 11 and free-index block 12;
//! - **create**: AGI; free-inode tree root; inode tree root and its last leaf (once there is
//!   more than one); the new inode's cluster buffer (16 inodes = 2 blocks, allocated
//!   sequentially); the parent's inode cluster; the hash-tree root, the hash leaf the name
//!   hashes to (uniformly random among the directory's leaves, one leaf per 400 entries), the
//!   free-index block and the directory's last data block (100 entries per block);
//! - every 64 creates a new inode chunk (4 clusters, created without reading): AGF, AGFL and
//!   both free-space roots; every 250 chunks a new inode tree leaf; every 100 creates a new
//!   directory data block: AGF, both free-space roots, the parent's extent-tree block;
//! - **unlink** (in creation order, as `rm -r` of a freshly made tree does): hash-tree root,
//!   hash leaf, free-index block, the data block holding the entry, the parent's cluster, the
//!   inode's cluster, AGI (unlinked list), inode tree root and leaf, free-inode tree root; every
//!   64 unlinks the chunk is freed (AGF, AGFL, free-space roots, its 4 clusters freed stale);
//!   every 100 unlinks a data block is freed likewise.
//!
//! AG headers and tree roots get reuse count 3, other blocks 1 (as XFS gives its headers).

use cairn_format::FsBlock;

use crate::{BufCacheError, BufKey, BufferCache, ReadSpec};

/// One step of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOp {
    /// Look the buffer up (reading it if absent), then release it.
    Get { key: BufKey, lru_ref: u32 },
    /// A newly allocated block: `get_new`, then release.
    Create { key: BufKey },
    /// The block was freed: look it up and mark it stale.
    Free { key: BufKey },
}

const AGF: u32 = 1;
const AGI: u32 = 2;
const AGFL: u32 = 3;
const BNO_ROOT: u32 = 4;
const CNT_ROOT: u32 = 5;
const INO_ROOT: u32 = 6;
const FINO_ROOT: u32 = 7;
const PARENT_CLUSTER: u32 = 8;
const PARENT_BMBT: u32 = 10;
const DIR_ROOT: u32 = 11;
const DIR_FREE_INDEX: u32 = 12;
const FIRST_FREE: u32 = 16;
const INODES_PER_CHUNK: u64 = 64;
const CLUSTER_INODES: u64 = 16;
const CLUSTER_BLOCKS: u32 = 2;
const CHUNKS_PER_INO_LEAF: u64 = 250;
const ENTRIES_PER_DATA_BLOCK: u64 = 100;
const ENTRIES_PER_HASH_LEAF: u64 = 400;
const HOT: u32 = 3;

/// One directory and its AG's allocation state.
#[derive(Debug, Default, Clone)]
struct Dir {
    next_free: u32,
    /// First block of each inode chunk, in allocation order.
    chunks: Vec<u32>,
    data_blocks: Vec<u32>,
    hash_leaves: Vec<u32>,
    ino_leaves: Vec<u32>,
    entries: u64,
}

/// Builds traces for `dir_count` directories, directory `d` in AG `d`, with AGs of
/// `ag_blocks` blocks.
#[derive(Debug, Clone)]
pub struct TraceBuilder {
    ag_blocks: u64,
    dirs: Vec<Dir>,
    rng: u64,
    ops: Vec<TraceOp>,
}

impl TraceBuilder {
    pub fn new(dir_count: u32, ag_blocks: u32, seed: u64) -> Self {
        let dir = Dir {
            next_free: FIRST_FREE,
            ..Dir::default()
        };
        Self {
            ag_blocks: u64::from(ag_blocks),
            dirs: vec![dir; dir_count as usize],
            rng: seed,
            ops: Vec::new(),
        }
    }

    fn random(&mut self, bound: usize) -> usize {
        // splitmix64: deterministic and dependency-free.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % bound.max(1) as u64) as usize
    }

    fn key(&self, dir: usize, ag_block: u32, block_count: u32) -> BufKey {
        BufKey::new(
            FsBlock(dir as u64 * self.ag_blocks + u64::from(ag_block)),
            block_count,
        )
    }

    fn get(&mut self, dir: usize, ag_block: u32, block_count: u32, lru_ref: u32) {
        let key = self.key(dir, ag_block, block_count);
        self.ops.push(TraceOp::Get { key, lru_ref });
    }

    fn alloc(&mut self, dir: usize, blocks: u32) -> u32 {
        let at = self.dirs[dir].next_free;
        self.dirs[dir].next_free += blocks;
        for ag_block in [AGF, AGFL, BNO_ROOT, CNT_ROOT] {
            self.get(dir, ag_block, 1, HOT);
        }
        at
    }

    fn free(&mut self, dir: usize, ag_block: u32, blocks: u32) {
        for header in [AGF, AGFL, BNO_ROOT, CNT_ROOT] {
            self.get(dir, header, 1, HOT);
        }
        let key = self.key(dir, ag_block, blocks);
        self.ops.push(TraceOp::Free { key });
    }

    fn inode_tree(&mut self, dir: usize) {
        self.get(dir, INO_ROOT, 1, HOT);
        if let Some(&leaf) = self.dirs[dir].ino_leaves.last() {
            self.get(dir, leaf, 1, 1);
        }
    }

    /// Directory lookups common to create and unlink: root, a hashed leaf, free index.
    fn dir_blocks(&mut self, dir: usize) {
        self.get(dir, DIR_ROOT, 1, HOT);
        let leaves = self.dirs[dir].hash_leaves.len();
        if leaves > 0 {
            let pick = self.random(leaves);
            let leaf = self.dirs[dir].hash_leaves[pick];
            self.get(dir, leaf, 1, 1);
        }
        self.get(dir, DIR_FREE_INDEX, 1, HOT);
    }

    fn create_one(&mut self, dir: usize) {
        let inode = self.dirs[dir].entries;
        self.get(dir, AGI, 1, HOT);
        if inode.is_multiple_of(INODES_PER_CHUNK) {
            self.new_chunk(dir);
        }
        self.get(dir, FINO_ROOT, 1, HOT);
        self.inode_tree(dir);
        let chunk = self.dirs[dir].chunks[(inode / INODES_PER_CHUNK) as usize];
        let cluster = chunk + ((inode % INODES_PER_CHUNK) / CLUSTER_INODES) as u32 * CLUSTER_BLOCKS;
        self.get(dir, cluster, CLUSTER_BLOCKS, 1);
        self.get(dir, PARENT_CLUSTER, CLUSTER_BLOCKS, HOT);
        if inode.is_multiple_of(ENTRIES_PER_HASH_LEAF) {
            let leaf = self.alloc(dir, 1);
            self.ops.push(TraceOp::Create {
                key: self.key(dir, leaf, 1),
            });
            self.dirs[dir].hash_leaves.push(leaf);
        }
        self.dir_blocks(dir);
        if inode.is_multiple_of(ENTRIES_PER_DATA_BLOCK) {
            self.get(dir, PARENT_BMBT, 1, HOT);
            let block = self.alloc(dir, 1);
            self.ops.push(TraceOp::Create {
                key: self.key(dir, block, 1),
            });
            self.dirs[dir].data_blocks.push(block);
        }
        let data = self.dirs[dir].data_blocks[(inode / ENTRIES_PER_DATA_BLOCK) as usize];
        self.get(dir, data, 1, 1);
        self.dirs[dir].entries += 1;
    }

    fn new_chunk(&mut self, dir: usize) {
        let chunk_blocks = (INODES_PER_CHUNK / CLUSTER_INODES) as u32 * CLUSTER_BLOCKS;
        let chunk = self.alloc(dir, chunk_blocks);
        for cluster in (0..chunk_blocks).step_by(CLUSTER_BLOCKS as usize) {
            let key = self.key(dir, chunk + cluster, CLUSTER_BLOCKS);
            self.ops.push(TraceOp::Create { key });
        }
        self.dirs[dir].chunks.push(chunk);
        if (self.dirs[dir].chunks.len() as u64 - 1).is_multiple_of(CHUNKS_PER_INO_LEAF) {
            let leaf = self.alloc(dir, 1);
            self.ops.push(TraceOp::Create {
                key: self.key(dir, leaf, 1),
            });
            self.dirs[dir].ino_leaves.push(leaf);
        }
    }

    /// Appends the trace of creating `file_count` files, round robin over the directories.
    pub fn create(&mut self, file_count: u64) -> &mut Self {
        for file in 0..file_count {
            self.create_one(file as usize % self.dirs.len());
        }
        self
    }

    fn unlink_one(&mut self, dir: usize, inode: u64) {
        self.dir_blocks(dir);
        let data = self.dirs[dir].data_blocks[(inode / ENTRIES_PER_DATA_BLOCK) as usize];
        self.get(dir, data, 1, 1);
        self.get(dir, PARENT_CLUSTER, CLUSTER_BLOCKS, HOT);
        let chunk = self.dirs[dir].chunks[(inode / INODES_PER_CHUNK) as usize];
        let cluster = chunk + ((inode % INODES_PER_CHUNK) / CLUSTER_INODES) as u32 * CLUSTER_BLOCKS;
        self.get(dir, cluster, CLUSTER_BLOCKS, 1);
        self.get(dir, AGI, 1, HOT);
        self.inode_tree(dir);
        self.get(dir, FINO_ROOT, 1, HOT);
        if (inode + 1).is_multiple_of(ENTRIES_PER_DATA_BLOCK) {
            self.get(dir, PARENT_BMBT, 1, HOT);
            self.free(dir, data, 1);
        }
        if (inode + 1).is_multiple_of(INODES_PER_CHUNK) {
            let chunk_blocks = (INODES_PER_CHUNK / CLUSTER_INODES) as u32 * CLUSTER_BLOCKS;
            for cluster in (0..chunk_blocks).step_by(CLUSTER_BLOCKS as usize) {
                self.free(dir, chunk + cluster, CLUSTER_BLOCKS);
            }
        }
    }

    /// Appends the trace of unlinking every file created so far, in creation order.
    pub fn unlink_all(&mut self) -> &mut Self {
        let created = self.dirs.iter().map(|d| d.entries).max().unwrap_or(0);
        for inode in 0..created {
            for dir in 0..self.dirs.len() {
                if inode < self.dirs[dir].entries {
                    self.unlink_one(dir, inode);
                }
            }
        }
        self
    }

    /// Takes the operations built so far.
    pub fn take(&mut self) -> Vec<TraceOp> {
        std::mem::take(&mut self.ops)
    }
}

/// Replays `ops` on `cache`, holding each buffer only for its step. `spec` supplies the
/// verifier; its `lru_ref` is replaced by each step's.
pub fn replay(cache: &BufferCache, ops: &[TraceOp], spec: &ReadSpec) -> Result<(), BufCacheError> {
    for op in ops {
        match *op {
            TraceOp::Get { key, lru_ref } => {
                drop(cache.get(key, &spec.with_lru_ref(lru_ref))?);
            }
            TraceOp::Create { key } => drop(cache.get_new(key, spec)?),
            TraceOp::Free { key } => cache.get(key, spec)?.mark_stale(),
        }
    }
    Ok(())
}
