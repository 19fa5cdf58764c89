//! The unit tests' device: a memory device formatted by mkfs with 4 KiB blocks.

use cairn_blockdev::MemDevice;

/// A `bytes`-byte memory device holding a fresh filesystem with `uuid`.
pub(crate) fn formatted(bytes: u64, uuid: [u8; 16]) -> MemDevice {
    let device = MemDevice::new(bytes, 4096);
    let request = cairn_mkfs::Request {
        fs_bytes: Some(bytes),
        ..cairn_mkfs::Request::default()
    };
    let plan = cairn_mkfs::plan(bytes, 4096, &request).unwrap();
    let options = cairn_mkfs::FormatOptions {
        uuid: Some(uuid),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options).unwrap();
    device
}
