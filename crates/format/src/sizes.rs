//! Compile-time size checks of every fixed-size on-disk structure, in one place so a layout
//! change cannot slip through unnoticed (each size also appears in `docs/format.md`).

use crate::agf::Agf;
use crate::agi::Agi;
use crate::btree_block::{BnoKey, BtreeHeader, CntKey, FreeSpaceRecord, InoKey, InodeRecord};
use crate::dir::{DirDataHeader, DirHashKey, DirHashRecord};
use crate::extent::{BmapKey, BmapPointer, Extent};
use crate::header::MetaHeader;
use crate::inode::InodeCore;
use crate::log::{InodeCreate, LogRecordHeader, ShiftIntent};
use crate::ondisk::OnDisk;
use crate::refcount::{RefcountKey, RefcountRecord};
use crate::superblock::Superblock;
use crate::symlink::SymlinkHeader;
use crate::xattr::{XattrIndexKey, XattrIndexRecord, XattrIndexRoot, XattrLeafHeader};

const _: () = assert!(MetaHeader::SIZE == 48);
const _: () = assert!(Superblock::SIZE == 256);
const _: () = assert!(Agf::SIZE == 128);
const _: () = assert!(Agi::SIZE == 384);
const _: () = assert!(BtreeHeader::SIZE == 72);
const _: () = assert!(FreeSpaceRecord::SIZE == 8);
const _: () = assert!(BnoKey::SIZE == 4);
const _: () = assert!(CntKey::SIZE == 8);
const _: () = assert!(InodeRecord::SIZE == 16);
const _: () = assert!(InoKey::SIZE == 4);
const _: () = assert!(Extent::SIZE == 16);
const _: () = assert!(BmapKey::SIZE == 8);
const _: () = assert!(BmapPointer::SIZE == 8);
const _: () = assert!(InodeCore::SIZE == 176);
const _: () = assert!(DirDataHeader::SIZE == 64);
const _: () = assert!(DirHashRecord::SIZE == 8);
const _: () = assert!(DirHashKey::SIZE == 4);
const _: () = assert!(LogRecordHeader::SIZE == 128);
const _: () = assert!(InodeCreate::SIZE == 24);
const _: () = assert!(ShiftIntent::SIZE == 48);
const _: () = assert!(SymlinkHeader::SIZE == 56);
const _: () = assert!(XattrLeafHeader::SIZE == 56);
const _: () = assert!(XattrIndexRecord::SIZE == 16);
const _: () = assert!(XattrIndexRoot::SIZE == 16);
const _: () = assert!(XattrIndexKey::SIZE == 8);
const _: () = assert!(RefcountRecord::SIZE == 12);
const _: () = assert!(RefcountKey::SIZE == 4);
