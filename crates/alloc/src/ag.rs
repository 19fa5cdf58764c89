//! One AG's free space during one operation: the AGF, the free list, and the two trees.
//!
//! `AgCtx` wraps the caller's buffer access and is the tree context of both free-space
//! trees: their splits take blocks from the AG free list, their merges give blocks back to it.

use cairn_btree::{BnoCodec, Btree, Buffers, CntCodec, TreeContext, TreeError, TreeSpec};
use cairn_bufcache::{BufGuard, HeaderOps, ReadSpec};
use cairn_format::agfl::{agfl_capacity, agfl_entry, agfl_slot_offset};
use cairn_format::limits::{AG_AGF_BLOCK, AG_AGFL_BLOCK};
use cairn_format::ondisk::put_u32;
use cairn_format::types::NULL_AG_BLOCK;
use cairn_format::{AgBlock, AgNumber, Agf, FsBlock, Geometry, MetaKind, OnDisk};

use crate::AllocError;
use crate::counters::OpCounters;

static AGF_OPS: HeaderOps = HeaderOps::new(MetaKind::Agf);
static AGFL_OPS: HeaderOps = HeaderOps::new(MetaKind::Agfl);

/// Byte offsets of the AGF fields the allocator changes.
pub(crate) mod field {
    pub const AG_LENGTH: usize = 52;
    pub const BNO_ROOT: usize = 56;
    pub const BNO_LEVELS: usize = 60;
    pub const CNT_ROOT: usize = 64;
    pub const CNT_LEVELS: usize = 68;
    pub const FREE_BLOCKS: usize = 72;
    pub const LONGEST_FREE: usize = 76;
    pub const BTREE_BLOCKS: usize = 80;
    pub const FREE_LIST_FIRST: usize = 84;
    pub const FREE_LIST_LAST: usize = 88;
    pub const FREE_LIST_COUNT: usize = 92;
    pub const REFCOUNT_ROOT: usize = 96;
    pub const REFCOUNT_LEVELS: usize = 100;
    pub const REFCOUNT_BLOCKS: usize = 104;
}

/// The tree and header access of one AG for one operation.
pub(crate) struct AgCtx<'x, B> {
    pub bufs: &'x mut B,
    pub agf: Agf,
    pub geometry: Geometry,
    pub uuid: [u8; 16],
    /// Work done in this AG by this operation.
    pub counters: OpCounters,
}

impl<'x, 'c, B: Buffers<'c>> AgCtx<'x, B> {
    /// Reads and checks the AGF of `ag`.
    pub fn open(
        bufs: &'x mut B,
        geometry: &Geometry,
        uuid: [u8; 16],
        ag: AgNumber,
    ) -> Result<Self, AllocError> {
        let block = agf_block(geometry, ag);
        let spec = agf_spec(uuid, ag);
        let guard = bufs.buffer(block, &spec, false)?;
        let decoded = Agf::decode(guard)
            .and_then(|agf| agf.check(geometry).map(|()| agf))
            .map_err(|e| AllocError::corrupt(block.0, e.to_string()))?;
        Ok(Self {
            bufs,
            agf: decoded,
            geometry: *geometry,
            uuid,
            counters: OpCounters {
                ags_tried: 1,
                ..OpCounters::default()
            },
        })
    }

    pub fn ag(&self) -> AgNumber {
        self.agf.ag_number
    }

    pub fn fs_block(&self, ag_block: u32) -> FsBlock {
        FsBlock(self.geometry.ag_start(self.ag().0) + u64::from(ag_block))
    }

    /// The two free-space trees as the AGF describes them.
    pub fn trees(&self) -> Result<(Btree<BnoCodec>, Btree<CntCodec>), AllocError> {
        let ag = self.ag().0;
        let bno_spec = TreeSpec::ag::<BnoCodec>(&self.geometry, self.uuid, ag)?;
        let cnt_spec = TreeSpec::ag::<CntCodec>(&self.geometry, self.uuid, ag)?;
        let bno = Btree::open(
            bno_spec,
            u64::from(self.agf.bno_root.0),
            self.agf.bno_levels,
        )?;
        let cnt = Btree::open(
            cnt_spec,
            u64::from(self.agf.cnt_root.0),
            self.agf.cnt_levels,
        )?;
        Ok((bno, cnt))
    }

    fn agf_guard(&mut self) -> Result<&mut BufGuard<'c>, AllocError> {
        let block = self.fs_block(AG_AGF_BLOCK);
        let spec = agf_spec(self.uuid, self.ag());
        Ok(self.bufs.buffer(block, &spec, false)?)
    }

    /// Writes one AGF field (4 bytes) if it changed; only those bytes are marked dirty.
    pub fn set_field(&mut self, offset: usize, value: u32) -> Result<(), AllocError> {
        let guard = self.agf_guard()?;
        let block = guard.block().0;
        let old = guard
            .get(offset..offset + 4)
            .map(|raw| u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]));
        if old != Some(value) {
            let bytes = guard
                .bytes_mut(offset..offset + 4)
                .map_err(|e| AllocError::corrupt(block, e.to_string()))?;
            put_u32(bytes, 0, value);
        }
        self.agf = apply_field(self.agf, offset, value);
        Ok(())
    }

    /// Copies the trees' roots and heights into the AGF.
    pub fn store_roots(
        &mut self,
        bno: &Btree<BnoCodec>,
        cnt: &Btree<CntCodec>,
    ) -> Result<(), AllocError> {
        let narrow = |v: u64| u32::try_from(v).unwrap_or(NULL_AG_BLOCK);
        self.set_field(field::BNO_ROOT, narrow(bno.root()))?;
        self.set_field(field::BNO_LEVELS, bno.levels())?;
        self.set_field(field::CNT_ROOT, narrow(cnt.root()))?;
        self.set_field(field::CNT_LEVELS, cnt.levels())
    }

    fn agfl_guard(&mut self) -> Result<&mut BufGuard<'c>, AllocError> {
        let block = self.fs_block(AG_AGFL_BLOCK);
        let spec = ReadSpec::new(&AGFL_OPS, self.uuid)
            .with_owner(u64::from(self.ag().0))
            .with_lru_ref(4);
        Ok(self.bufs.buffer(block, &spec, false)?)
    }

    fn agfl_capacity(&self) -> u32 {
        agfl_capacity(self.geometry.block_size)
    }

    /// Takes the first block off the free list.
    pub fn pop_free_list(&mut self) -> Result<Option<u32>, AllocError> {
        if self.agf.free_list_count == 0 {
            return Ok(None);
        }
        let slot = self.agf.free_list_first;
        let guard = self.agfl_guard()?;
        let block = guard.block().0;
        let value = agfl_entry(guard, slot)
            .filter(|v| *v != NULL_AG_BLOCK)
            .ok_or_else(|| AllocError::corrupt(block, format!("free list slot {slot} empty")))?;
        let at = agfl_slot_offset(slot);
        guard
            .write(at, &NULL_AG_BLOCK.to_le_bytes())
            .map_err(|e| AllocError::corrupt(block, e.to_string()))?;
        let first = (slot + 1) % self.agfl_capacity();
        self.set_field(field::FREE_LIST_FIRST, first)?;
        self.set_field(field::FREE_LIST_COUNT, self.agf.free_list_count - 1)?;
        Ok(Some(value))
    }

    /// Appends `ag_block` to the free list.
    pub fn push_free_list(&mut self, ag_block: u32) -> Result<(), AllocError> {
        let capacity = self.agfl_capacity();
        if self.agf.free_list_count >= capacity {
            let block = self.fs_block(AG_AGFL_BLOCK).0;
            return Err(AllocError::corrupt(block, "free list full"));
        }
        let slot = (self.agf.free_list_last + 1) % capacity;
        let guard = self.agfl_guard()?;
        let block = guard.block().0;
        guard
            .write(agfl_slot_offset(slot), &ag_block.to_le_bytes())
            .map_err(|e| AllocError::corrupt(block, e.to_string()))?;
        self.set_field(field::FREE_LIST_LAST, slot)?;
        self.set_field(field::FREE_LIST_COUNT, self.agf.free_list_count + 1)
    }

    /// The blocks on the free list, in order.
    pub fn free_list(&mut self) -> Result<Vec<u32>, AllocError> {
        let slots: Vec<u32> = self.agf.free_list_slots(self.agfl_capacity()).collect();
        let guard = self.agfl_guard()?;
        Ok(slots
            .into_iter()
            .map(|slot| agfl_entry(guard, slot).unwrap_or(NULL_AG_BLOCK))
            .collect())
    }
}

/// The block of AG `ag`'s header. Holding its buffer is holding the AG lock.
pub(crate) fn agf_block(geometry: &Geometry, ag: AgNumber) -> FsBlock {
    FsBlock(geometry.ag_start(ag.0) + u64::from(AG_AGF_BLOCK))
}

fn agf_spec(uuid: [u8; 16], ag: AgNumber) -> ReadSpec {
    ReadSpec::new(&AGF_OPS, uuid)
        .with_owner(u64::from(ag.0))
        .with_lru_ref(8)
}

fn apply_field(mut agf: Agf, offset: usize, value: u32) -> Agf {
    match offset {
        field::AG_LENGTH => agf.ag_length = value,
        field::BNO_ROOT => agf.bno_root = AgBlock(value),
        field::BNO_LEVELS => agf.bno_levels = value,
        field::CNT_ROOT => agf.cnt_root = AgBlock(value),
        field::CNT_LEVELS => agf.cnt_levels = value,
        field::FREE_BLOCKS => agf.free_blocks = value,
        field::LONGEST_FREE => agf.longest_free = value,
        field::BTREE_BLOCKS => agf.btree_blocks = value,
        field::FREE_LIST_FIRST => agf.free_list_first = value,
        field::FREE_LIST_LAST => agf.free_list_last = value,
        field::FREE_LIST_COUNT => agf.free_list_count = value,
        field::REFCOUNT_ROOT => agf.refcount_root = AgBlock(value),
        field::REFCOUNT_LEVELS => agf.refcount_levels = value,
        field::REFCOUNT_BLOCKS => agf.refcount_blocks = value,
        _ => {}
    }
    agf
}

pub(crate) fn tree_error(error: AllocError) -> TreeError {
    match error {
        AllocError::Tree(inner) => inner,
        other => TreeError::Context {
            what: other.to_string(),
        },
    }
}

impl<'c, B: Buffers<'c>> Buffers<'c> for AgCtx<'_, B> {
    fn buffer(
        &mut self,
        block: FsBlock,
        spec: &ReadSpec,
        new: bool,
    ) -> Result<&mut BufGuard<'c>, TreeError> {
        self.bufs.buffer(block, spec, new)
    }

    fn invalidate(&mut self, block: FsBlock, spec: &ReadSpec) -> Result<(), TreeError> {
        self.bufs.invalidate(block, spec)
    }

    fn holds(&mut self, block: FsBlock) -> bool {
        self.bufs.holds(block)
    }

    fn joined_mark(&mut self) -> usize {
        self.bufs.joined_mark()
    }

    fn release_unchanged_since(&mut self, mark: usize) -> bool {
        self.bufs.release_unchanged_since(mark)
    }
}

impl<'c, B: Buffers<'c>> TreeContext<'c> for AgCtx<'_, B> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let block =
            self.pop_free_list()
                .map_err(tree_error)?
                .ok_or_else(|| TreeError::NoSpace {
                    why: format!("AG {} free list is empty", self.ag().0),
                })?;
        self.counters.tree_blocks_taken += 1;
        let used = self.agf.btree_blocks + 1;
        self.set_field(field::BTREE_BLOCKS, used)
            .map_err(tree_error)?;
        Ok(self.fs_block(block))
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        let ag_block = self.geometry.ag_block_of(block).0;
        self.push_free_list(ag_block).map_err(tree_error)?;
        self.counters.tree_blocks_freed += 1;
        let used = self.agf.btree_blocks.saturating_sub(1);
        self.set_field(field::BTREE_BLOCKS, used)
            .map_err(tree_error)
    }
}
