//! Block device layer: the only place cairn touches a device or image file.
//!
//! Owns: the `BlockDevice` trait, the sector-aligned buffer type `AlignedBuf`, `FileDevice`
//! (an image file or raw block device with `O_DIRECT`, opened exclusively; a batch of writes
//! goes to the kernel in one io_uring submission, `write_batch`; reads handed over with
//! `read_async` are in flight with no thread waiting, a completion thread per device
//! finishing them), and `MemDevice`
//! (an in-memory device that records writes and flushes, builds crash images from that log
//! and injects faults).
//! Invariants:
//! - every transfer is sector-aligned in offset, length and memory; misaligned requests are
//!   refused with `DeviceError::Misaligned` before any system call;
//! - a write that returned before `flush` returned is durable; nothing else is promised, and
//!   `MemDevice` crash images explore exactly that freedom (see [`crash`]);
//! - short transfers are retried to completion or reported, never silently accepted;
//! - `write_batch` returns only once none of its writes is in flight (even when it unwinds),
//!   so no write outlives the memory it reads; `read_async` owns its buffer until it hands
//!   it to `done`;
//! - at most one read-write opener per image or device, across processes (locks, `O_EXCL`) and
//!   inside this process (a registry); refusals name the holder where the system can tell.
//!
//! ```
//! use cairn_blockdev::{AlignedBuf, BlockDevice, CrashPoint, MemDevice};
//!
//! let device = MemDevice::new(8192, 4096);
//! device.write_at(0, &AlignedBuf::from_slice(&[1; 4096])).unwrap();
//! device.flush().unwrap();
//! device.write_at(4096, &AlignedBuf::from_slice(&[2; 4096])).unwrap();
//! // Crash after the flush, with the later write lost: only the first block survives.
//! let image = device.crash_image(&CrashPoint::at_flush(1)).unwrap();
//! assert_eq!((image[0], image[4096]), (1, 0));
//! ```

mod aligned;
mod batch;
mod claim;
pub mod crash;
mod device;
mod error;
mod fault;
mod file;
mod mem;
mod reads;
mod sys;

pub use aligned::{AlignedBuf, BUFFER_ALIGN};
pub use batch::BatchWrite;
pub use crash::{CrashPoint, LogOp, TornWrite, WriteExtent};
pub use device::{BlockDevice, bounce_read, check_transfer, write_zero_buffers};
pub use error::DeviceError;
pub use fault::MemStats;
pub use file::{
    DeviceKind, FileDevice, IMAGE_PHYSICAL_SECTOR_SIZE, IMAGE_SECTOR_SIZE_DEFAULT, OpenOptions,
};
pub use mem::MemDevice;
pub use reads::{ReadDone, ReadJob};
