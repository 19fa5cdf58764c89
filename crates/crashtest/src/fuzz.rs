//! The corrupted-image harness: a populated image, a list of its metadata units (whole
//! blocks, or single inodes inside inode chunks), and mutations of one unit (bit flips, zeroed
//! blocks, plausible-but-wrong values with the CRC recomputed). Each mutated image is mounted,
//! walked, changed a little, unmounted and checked by fsck; nothing may panic or hang, and
//! errors must name what is damaged.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use cairn_blockdev::MemDevice;
use cairn_format::header::{HEADER_SIZE, stamp};
use cairn_format::{MetaKind, OnDisk};
use cairn_fs::{Credentials, FileKind, FsError};

use crate::image::{self, SECTOR_BYTES, TEST_UUID};
use crate::model::pattern;
use crate::op::{self, Op};
use crate::workload::Rng;
use crate::{CrashError, panic_message};

/// Most bytes of each file the walk reads on a fuzzed image (a damaged size may be huge).
const FUZZ_READ_MAX_BYTES: u64 = 1 << 20;
/// A case still running after this long counts as a hang (a watchdog, not a speed check).
const HANG_LIMIT: Duration = Duration::from_secs(300);
/// Files created in the populated image's large directory (past the short form).
const BIG_DIR_FILES: usize = 120;

/// One metadata unit of an image: a byte range that carries its own header and CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    pub offset: usize,
    pub len: usize,
    pub kind: MetaKind,
}

/// How a unit is damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    BitFlip {
        bit: usize,
    },
    ZeroBlock,
    /// A plausible value written at `at` (past the header) and the CRC recomputed.
    Plausible {
        at: usize,
        value: u64,
        wide: bool,
    },
}

/// What one fuzzed image did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaseOutcome {
    pub mounted: bool,
    pub walk_error: Option<String>,
    pub fsck_problems: usize,
    /// A panic, a hang, or an error that names nothing.
    pub violation: Option<String>,
}

/// A populated image: the setup tree, a large directory and a random workload, unmounted.
pub fn populated_image(seed: u64) -> Result<Vec<u8>, CrashError> {
    let device = Arc::new(image::formatted_device(image::CRASH_DEVICE_BYTES)?);
    let mut ops = op::setup_ops();
    ops.push(Op::Mkdir("big".into()));
    ops.extend((0..BIG_DIR_FILES).map(|index| Op::Create(format!("big/entry-{index:04}"))));
    ops.extend(crate::workload::random(seed, 60).ops);
    crate::runner::run(&device, &[], &ops)?;
    Ok(device.snapshot())
}

/// The metadata units of `image`: blocks whose header names a metadata kind and carries the
/// test UUID, split into inodes where the block is an inode chunk.
pub fn metadata_units(image: &[u8], block_bytes: usize, inode_bytes: usize) -> Vec<Unit> {
    let mut units = Vec::new();
    for (index, block) in image.chunks(block_bytes).enumerate() {
        let Some(kind) = unit_kind(block) else {
            continue;
        };
        let offset = index * block_bytes;
        if kind == MetaKind::Inode {
            for (slot, inode) in block.chunks(inode_bytes).enumerate() {
                if unit_kind(inode) == Some(MetaKind::Inode) {
                    units.push(Unit {
                        offset: offset + slot * inode_bytes,
                        len: inode_bytes,
                        kind,
                    });
                }
            }
        } else {
            units.push(Unit {
                offset,
                len: block_bytes,
                kind,
            });
        }
    }
    units
}

fn unit_kind(bytes: &[u8]) -> Option<MetaKind> {
    let header = cairn_format::header::MetaHeader::decode(bytes.get(..HEADER_SIZE)?).ok()?;
    (header.uuid == TEST_UUID)
        .then(|| MetaKind::from_magic(header.magic))
        .flatten()
}

/// A random mutation of `unit`.
pub fn random_mutation(rng: &mut Rng, unit: &Unit, image: &[u8]) -> Mutation {
    match rng.below(4) {
        0 => Mutation::BitFlip {
            bit: rng.below(unit.len as u64 * 8) as usize,
        },
        1 => Mutation::ZeroBlock,
        _ => {
            let wide = rng.below(2) == 0;
            let width = if wide { 8 } else { 4 };
            let slots = (unit.len - HEADER_SIZE) / width;
            let at = HEADER_SIZE + rng.below(slots as u64) as usize * width;
            let old = read_value(&image[unit.offset + at..], wide);
            let value = match rng.below(6) {
                0 => 0,
                1 => old.wrapping_add(1),
                2 => old.wrapping_sub(1),
                3 => old.wrapping_mul(2),
                4 => rng.below(1 << 13),
                _ => u64::MAX,
            };
            Mutation::Plausible { at, value, wide }
        }
    }
}

fn read_value(bytes: &[u8], wide: bool) -> u64 {
    let mut raw = [0u8; 8];
    let width = if wide { 8 } else { 4 };
    raw[..width].copy_from_slice(&bytes[..width]);
    u64::from_le_bytes(raw)
}

/// Applies `mutation` to `unit` of `image`.
pub fn apply_mutation(image: &mut [u8], unit: &Unit, mutation: Mutation, block_bytes: usize) {
    match mutation {
        Mutation::BitFlip { bit } => image[unit.offset + bit / 8] ^= 1 << (bit % 8),
        Mutation::ZeroBlock => {
            let start = unit.offset / block_bytes * block_bytes;
            image[start..start + block_bytes].fill(0);
        }
        Mutation::Plausible { at, value, wide } => {
            let width = if wide { 8 } else { 4 };
            let bytes = value.to_le_bytes();
            let start = unit.offset + at;
            image[start..start + width].copy_from_slice(&bytes[..width]);
            stamp(&mut image[unit.offset..unit.offset + unit.len], None);
        }
    }
}

/// Mounts, walks, changes and unmounts the damaged `image`, then runs fsck, all in a thread
/// watched for hangs; panics and hangs become the outcome's violation.
pub fn run_case(image: Vec<u8>) -> CaseOutcome {
    let (send, receive) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(|| exercise(image)));
            let outcome = result.unwrap_or_else(|panic| CaseOutcome {
                violation: Some(format!("panic: {}", panic_message(panic.as_ref()))),
                ..CaseOutcome::default()
            });
            // The receiver only goes away after a hang was reported; nothing to do then.
            let _ = send.send(outcome);
        });
    if let Err(error) = spawned {
        return CaseOutcome {
            violation: Some(format!("cannot start the case thread: {error}")),
            ..CaseOutcome::default()
        };
    }
    receive
        .recv_timeout(HANG_LIMIT)
        .unwrap_or_else(|_| CaseOutcome {
            violation: Some("hang: the case did not finish".into()),
            ..CaseOutcome::default()
        })
}

/// An error that names nothing (anything but corruption, I/O or a plain lookup failure).
fn unnamed(error: &FsError) -> Option<String> {
    match error {
        FsError::Corrupt { .. }
        | FsError::Io { .. }
        | FsError::ShutDown
        | FsError::NotFound
        | FsError::NoSpace
        | FsError::Unsupported => None,
        other => Some(format!("error naming no structure: {other}")),
    }
}

fn exercise(image: Vec<u8>) -> CaseOutcome {
    let mut outcome = CaseOutcome::default();
    let device = match MemDevice::from_image(image, SECTOR_BYTES) {
        Ok(device) => Arc::new(device),
        Err(error) => {
            outcome.violation = Some(format!("device: {error}"));
            return outcome;
        }
    };
    if let Err(error) = image::fsck(device.as_ref()) {
        outcome.fsck_problems = match error {
            CrashError::Fsck(problems) => problems.len(),
            _ => 1,
        };
    }
    match image::mount(&device) {
        Ok(fs) => {
            outcome.mounted = true;
            if let Err(error) = crate::walk::walk(&fs, FUZZ_READ_MAX_BYTES) {
                outcome.walk_error = Some(error.to_string());
                if let crate::walk::WalkError::Fs { source, .. } = &error {
                    outcome.violation = unnamed(source);
                }
            }
            change_a_little(&fs);
            let _ = fs.unmount();
        }
        Err(error) => outcome.violation = unnamed(&error),
    }
    // fsck after a session on a damaged image: it may find problems, it must not panic.
    let _ = image::fsck(device.as_ref());
    outcome
}

/// A create, a write and an fsync on a possibly damaged filesystem; errors are expected.
fn change_a_little(fs: &cairn_fs::Filesystem) {
    let who = Credentials::root();
    if let Ok(attr) = fs.create(fs.root(), b"fuzz-new", FileKind::Regular, 0o644, 0, &who) {
        let _ = fs.write(attr.inode, 0, &pattern(7, 0, 9000));
        let _ = fs.fsync(attr.inode, false);
        fs.forget(attr.inode, 1);
    }
    let _ = fs.unlink(fs.root(), b"foo", &who);
}
