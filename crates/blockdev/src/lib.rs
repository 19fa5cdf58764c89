//! Block device layer: the only place cairn touches a device or image file.
//!
//! Owns: the `BlockDevice` trait, the sector-aligned buffer type `AlignedBuf`, the `O_DIRECT`
//! file / raw-device backend, and the in-memory device used by crash tests.
//! Invariants:
//! - every transfer is sector-aligned in offset, length and memory; misaligned requests are
//!   refused with `DeviceError::Misaligned` before any system call;
//! - a write that returned before `flush` returned is durable; nothing else is promised;
//! - short transfers are retried to completion or reported, never silently accepted.

mod aligned;
mod claim;
pub mod crash;
mod device;
mod error;
mod fault;
mod file;
mod mem;
mod sys;

pub use aligned::{AlignedBuf, BUFFER_ALIGN};
pub use crash::{CrashPoint, LogOp, TornWrite, WriteExtent};
pub use device::{BlockDevice, check_transfer};
pub use error::DeviceError;
pub use fault::MemStats;
pub use file::{
    DeviceKind, FileDevice, IMAGE_PHYSICAL_SECTOR_SIZE, IMAGE_SECTOR_SIZE_DEFAULT, OpenOptions,
};
pub use mem::MemDevice;
