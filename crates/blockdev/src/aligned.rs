//! A heap buffer aligned for `O_DIRECT`, so no caller ever handles a raw pointer.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Memory alignment of every `AlignedBuf`: the largest logical sector size we accept, so a
/// buffer is valid for direct I/O on any device.
pub const BUFFER_ALIGN: usize = 4096;

/// A zero-initialised byte buffer whose address is `BUFFER_ALIGN`-aligned.
///
/// The length is whatever the caller asked for; the device checks that it is a multiple of its
/// sector size before any transfer. `set_len` changes it within the allocation (`capacity`),
/// so one buffer can serve transfers of many sizes without being allocated and zeroed again.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated (and zeroed) at `ptr`; `len` never exceeds it.
    capacity: usize,
}

// SAFETY: the buffer uniquely owns its allocation, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, like a `Vec<u8>`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes. A zero length gives an empty buffer without allocating.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: Self::dangling(),
                len: 0,
                capacity: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        match NonNull::new(raw) {
            Some(ptr) => Self {
                ptr,
                len,
                capacity: len,
            },
            None => alloc::handle_alloc_error(layout),
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated: the largest length `set_len` accepts.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes the buffer `len` bytes long within its allocation; returns false (and changes
    /// nothing) when `len` exceeds `capacity`. Bytes that come back into view hold whatever
    /// they held before (zeros, or earlier contents): callers overwrite what they use.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.capacity {
            return false;
        }
        self.len = len;
        true
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, BUFFER_ALIGN) {
            Ok(layout) => layout,
            // Only reachable for lengths near isize::MAX, which no allocation could satisfy.
            Err(_) => alloc::handle_alloc_error(Layout::new::<[u8; BUFFER_ALIGN]>()),
        }
    }

    fn dangling() -> NonNull<u8> {
        // An aligned, non-null, never-dereferenced address for empty buffers.
        NonNull::new(std::ptr::without_provenance_mut(BUFFER_ALIGN)).unwrap_or(NonNull::dangling())
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.capacity != 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `capacity >= len` initialised bytes (zeroed at
        // allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for AlignedBuf {}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A shorter length keeps the allocation and its bytes; a longer one than allocated is
    // refused.
    #[test]
    fn set_len_stays_within_the_allocation() {
        let mut buf = AlignedBuf::zeroed(8192);
        buf[4095] = 7;
        assert!(buf.set_len(4096));
        assert_eq!((buf.len(), buf.capacity(), buf[4095]), (4096, 8192, 7));
        assert!(!buf.set_len(8193));
        assert!(buf.set_len(8192));
        assert_eq!(buf[4095], 7);
        assert!(buf.set_len(0) && buf.is_empty());
    }

    // Checks that every buffer is aligned and zeroed, including the empty one.
    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [0usize, 1, 512, 4096, 65536, 1 << 20] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % BUFFER_ALIGN, 0);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    // Checks that clones are deep copies.
    #[test]
    fn clone_is_independent() {
        let mut a = AlignedBuf::from_slice(&[7u8; 512]);
        let b = a.clone();
        a[0] = 1;
        assert_eq!(b[0], 7);
        assert_ne!(a, b);
    }
}
