use std::mem::{align_of, size_of};

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Page size assumed for the alignment of write data (cairn patch 3).
const PAGE_SIZE: usize = 4096;
/// Bytes before the data of a `FUSE_WRITE` request: the in-header, then `fuse_write_in`.
const WRITE_HEADER_SIZE: usize =
    size_of::<abi::fuse_in_header>() + size_of::<abi::fuse_write_in>();

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space,
/// and a page more for the alignment of write data.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096 + PAGE_SIZE;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    ///
    /// The actual buffer may be slightly larger to accommodate alignment requirements.
    pub(crate) fn new() -> Self {
        Self {
            buffer: vec![0; BUFFER_SIZE],
        }
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    ///
    /// cairn patch 3: the portion starts `WRITE_HEADER_SIZE` bytes before a page boundary,
    /// so the data of a write request starts on a page and a filesystem can hand it to
    /// `O_DIRECT` I/O without copying it. `WRITE_HEADER_SIZE` (80) is a multiple of the
    /// header's alignment, so the header stays aligned.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        const _: () = assert!(WRITE_HEADER_SIZE % align_of::<abi::fuse_in_header>() == 0);
        let data_at = self.buffer.as_ptr() as usize + WRITE_HEADER_SIZE;
        let off = (PAGE_SIZE - data_at % PAGE_SIZE) % PAGE_SIZE;
        &mut self.buffer[off..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_data_starts_on_a_page() {
        let mut buf = FuseReadBuf::new();
        let slice = buf.as_mut();
        assert!(slice.len() >= MAX_WRITE_SIZE + 4096);
        assert_eq!((slice.as_ptr() as usize + WRITE_HEADER_SIZE) % PAGE_SIZE, 0);
        assert_eq!(slice.as_ptr() as usize % align_of::<abi::fuse_in_header>(), 0);
    }
}
