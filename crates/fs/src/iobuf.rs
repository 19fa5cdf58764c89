//! Data I/O buffers reused per thread.
//!
//! A 1 MiB read or write used to allocate a zeroed buffer for the device transfer (and a
//! read a second, zeroed `Vec` for the reply): each allocation costs a 1 MiB memset or as
//! many page faults, about a fifth of a request's time at device speed. Each thread now
//! keeps one spare aligned buffer; a transfer takes it (or allocates once), and gives it
//! back when done. A reused buffer holds the bytes of its previous transfer, so every user
//! writes every byte it exposes: device reads, copies of the caller's data, or zeros.

use std::cell::Cell;
use std::ops::Deref;

use cairn_blockdev::AlignedBuf;

/// Largest buffer a thread keeps: a 1 MiB request (the default `max_write`) starting in
/// the middle of a block, plus one block for the end. Larger transfers allocate each time.
const SPARE_MAX_BYTES: usize = (1 << 20) + 2 * 65536;

thread_local! {
    static SPARE: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
}

/// A buffer of `len` bytes with unspecified contents: this thread's spare if large enough,
/// else a new zeroed one.
pub(crate) fn take(len: usize) -> AlignedBuf {
    if let Some(mut spare) = SPARE.take()
        && spare.set_len(len)
    {
        return spare;
    }
    AlignedBuf::zeroed(len)
}

/// Keeps `buf` as this thread's spare, unless it is larger than a spare may be or the
/// thread's spare is larger.
pub(crate) fn give_back(buf: AlignedBuf) {
    if buf.capacity() > SPARE_MAX_BYTES {
        return;
    }
    let kept = SPARE.take();
    let larger = match kept {
        Some(kept) if kept.capacity() >= buf.capacity() => kept,
        _ => buf,
    };
    SPARE.set(Some(larger));
}

/// The bytes of a read: a window of a device buffer. The buffer is this thread's spare
/// (it goes back there when dropped: the FUSE reply is sent from the same thread, so the
/// next read reuses it) or one of the read buffers (`reads::ReadBuffers`), shared by the
/// reads a read-ahead serves and given back to them when the last is dropped.
pub struct ReadData {
    buf: Option<Held>,
    start: usize,
    len: usize,
}

enum Held {
    Spare(AlignedBuf),
    Shared(std::sync::Arc<crate::reads::PooledBuf>),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Spare(buf) => buf,
            Held::Shared(buf) => buf.bytes(),
        }
    }
}

impl ReadData {
    /// `len` bytes of `buf` from `start`; the caller has filled them.
    pub(crate) fn new(buf: AlignedBuf, start: usize, len: usize) -> Self {
        Self::window(Held::Spare(buf), start, len)
    }

    /// `len` bytes of a read buffer from `start`; the caller has filled them.
    pub(crate) fn shared(
        buf: std::sync::Arc<crate::reads::PooledBuf>,
        start: usize,
        len: usize,
    ) -> Self {
        Self::window(Held::Shared(buf), start, len)
    }

    fn window(buf: Held, start: usize, len: usize) -> Self {
        let end = start.saturating_add(len).min(buf.bytes().len());
        Self {
            start: start.min(end),
            len: end - start.min(end),
            buf: Some(buf),
        }
    }

    /// No bytes (a read at or past the end of the file).
    pub(crate) fn empty() -> Self {
        Self {
            buf: None,
            start: 0,
            len: 0,
        }
    }
}

impl Deref for ReadData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf.bytes()[self.start..self.start + self.len],
            None => &[],
        }
    }
}

impl Drop for ReadData {
    fn drop(&mut self) {
        if let Some(Held::Spare(buf)) = self.buf.take() {
            give_back(buf);
        }
    }
}

impl std::fmt::Debug for ReadData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadData")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The spare comes back with the asked length, keeps its allocation, and the larger of
    // two buffers is the one kept.
    #[test]
    fn the_spare_is_reused_and_the_larger_kept() {
        let buf = take(8192);
        let address = buf.as_ptr();
        give_back(buf);
        let again = take(4096);
        assert_eq!((again.as_ptr(), again.len()), (address, 4096));
        give_back(AlignedBuf::zeroed(4096));
        give_back(again);
        assert_eq!(take(8192).as_ptr(), address);
        let big = take(SPARE_MAX_BYTES + 4096);
        give_back(big);
        assert_eq!(take(16384).len(), 16384);
    }

    #[test]
    fn read_data_shows_its_window() {
        let mut buf = take(8192);
        buf[100..104].copy_from_slice(b"abcd");
        let data = ReadData::new(buf, 100, 4);
        assert_eq!(&data[..], b"abcd");
        assert!(ReadData::empty().is_empty());
        assert_eq!(ReadData::new(AlignedBuf::zeroed(10), 8, 5).len(), 2);
    }
}
