//! Ring entries: the memory the kernel copies a request into and a reply out of, the
//! rebuilding of a request into the layout a read of `/dev/fuse` gives (so fuser decodes
//! it unchanged), and the sink through which fuser's reply lands in the entry.
//!
//! One allocation per worker ring (`QueueMemory`); per entry, page aligned:
//!
//! ```text
//! | header page                                  | payload (registered) | slack page |
//! | fuse_uring_req_header ... rebuilt in header  | request args / reply |            |
//! |                           + per-opcode struct| data                 |            |
//! ```
//!
//! The kernel sees the first 288 bytes of the header page and the payload. A request is
//! rebuilt by copying its `fuse_in_header` and per-opcode struct to the end of the header
//! page, right before the payload that holds the rest of its arguments: the whole request
//! is then one slice, and the payload (write data) is never copied. The payload starts on
//! a page, so write data arrives page aligned, as `O_DIRECT` device I/O needs it.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io::{self, IoSlice};
use std::ptr::NonNull;

use parking_lot::Mutex;

use super::abi::{self, IN_HEADER_BYTES, OP_IN_BYTES, OUT_HEADER_BYTES, ReqHeader};

/// Page size the layout is built on (the kernel pins nothing, so 4 KiB alignment is all
/// that matters, for `O_DIRECT`).
pub const PAGE_BYTES: usize = 4096;

/// The buffers of one queue's entries.
#[derive(Debug)]
pub struct QueueMemory {
    base: NonNull<u8>,
    layout: Layout,
    stride_bytes: usize,
    payload_bytes: usize,
    depth: usize,
}

// SAFETY: the memory is owned by this value alone; the kernel reads and writes an entry
// only while the entry is registered with it, and the worker only while it is not.
unsafe impl Send for QueueMemory {}

impl QueueMemory {
    /// Room for `depth` entries with payload buffers of `payload_bytes` (a multiple of the
    /// page size).
    pub fn new(depth: usize, payload_bytes: usize) -> io::Result<QueueMemory> {
        debug_assert_eq!(payload_bytes % PAGE_BYTES, 0);
        let stride_bytes = 2 * PAGE_BYTES + payload_bytes;
        let total = stride_bytes
            .checked_mul(depth)
            .ok_or_else(|| io::Error::other("ring buffers larger than the address space"))?;
        let layout = Layout::from_size_align(total, PAGE_BYTES).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size (depth and payload are positive).
        let base = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(base).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, "no memory for the ring buffers")
        })?;
        Ok(QueueMemory {
            base,
            layout,
            stride_bytes,
            payload_bytes,
            depth,
        })
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Entry `index` (< depth).
    pub fn entry(&self, index: usize) -> EntryMemory {
        assert!(
            index < self.depth,
            "ring entry {index} out of {}",
            self.depth
        );
        // SAFETY: index < depth, so the page lies inside the allocation.
        let page = unsafe { self.base.as_ptr().add(index * self.stride_bytes) };
        EntryMemory {
            page,
            payload_bytes: self.payload_bytes,
        }
    }
}

impl Drop for QueueMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// One entry's buffers (raw: the kernel writes them between uses).
#[derive(Debug, Clone, Copy)]
pub struct EntryMemory {
    page: *mut u8,
    payload_bytes: usize,
}

/// Why an entry's request cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed ring request: length {len}, payload {payload} bytes (buffer {capacity})")]
pub struct Malformed {
    pub len: u32,
    pub payload: u32,
    pub capacity: usize,
}

/// A request rebuilt in its entry: where its bytes start in the header page and how long
/// it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    pub offset: usize,
    pub len: usize,
    pub unique: u64,
    pub commit_id: u64,
    /// Request bytes in the payload; the reply is written after them.
    pub payload_in_bytes: usize,
}

impl EntryMemory {
    pub fn header_ptr(&self) -> *mut ReqHeader {
        self.page.cast()
    }

    pub fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: the payload follows the header page inside the entry.
        unsafe { self.page.add(PAGE_BYTES) }
    }

    /// The two buffers REGISTER hands the kernel: header and payload.
    pub fn iovecs(&self) -> [libc::iovec; 2] {
        [
            libc::iovec {
                iov_base: self.page.cast(),
                iov_len: size_of::<ReqHeader>(),
            },
            libc::iovec {
                iov_base: self.payload_ptr().cast(),
                iov_len: self.payload_bytes,
            },
        ]
    }

    /// Copies the request's header and per-opcode struct to the end of the header page,
    /// so that with the payload after it the request reads as from `/dev/fuse`. Call only
    /// while the entry is with the daemon.
    pub fn rebuild(&self) -> Result<Rebuilt, Malformed> {
        // SAFETY: the entry is with the daemon; the header is plain data.
        let header: ReqHeader = unsafe { self.header_ptr().read() };
        let (len, unique) = abi::in_header_fields(&header.in_out);
        let payload = header.ent_in_out.payload_bytes;
        let malformed = Malformed {
            len,
            payload,
            capacity: self.payload_bytes,
        };
        let op_in_bytes = (len as usize)
            .checked_sub(IN_HEADER_BYTES + payload as usize)
            .filter(|&bytes| bytes <= OP_IN_BYTES && payload as usize <= self.payload_bytes)
            .ok_or(malformed)?;
        let offset = PAGE_BYTES - IN_HEADER_BYTES - op_in_bytes;
        // SAFETY: offset >= PAGE - 168 > 288, so the copies land in the header page past
        // the kernel's part, which they do not overlap.
        unsafe {
            let to = self.page.add(offset);
            std::ptr::copy_nonoverlapping(header.in_out.as_ptr(), to, IN_HEADER_BYTES);
            let to = to.add(IN_HEADER_BYTES);
            std::ptr::copy_nonoverlapping(header.op_in.as_ptr(), to, op_in_bytes);
        }
        Ok(Rebuilt {
            offset,
            len: len as usize,
            unique,
            commit_id: header.ent_in_out.commit_id,
            payload_in_bytes: payload as usize,
        })
    }

    /// The rebuilt request's bytes.
    ///
    /// # Safety
    /// `rebuilt` came from `rebuild` on this entry, the entry stays with the daemon while
    /// the slice lives, and nothing writes the request's bytes meanwhile (the sink writes
    /// the reply past them).
    pub unsafe fn request(&self, rebuilt: &Rebuilt) -> &[u8] {
        // SAFETY: per the contract; offset + len ends inside the payload.
        unsafe { std::slice::from_raw_parts(self.page.add(rebuilt.offset), rebuilt.len) }
    }

    /// Writes an error reply with no data for request `unique`.
    pub fn write_error(&self, unique: u64, errno: i32) {
        let out = abi::error_header(unique, errno);
        // SAFETY: the entry is with the daemon; the header page is page aligned and the
        // out header is plain data at its start.
        unsafe {
            let header = self.header_ptr();
            header.cast::<abi::OutHeader>().write(out);
            (*header).ent_in_out.payload_bytes = 0;
        }
    }
}

/// Where fuser's reply to the request in flight on an entry goes.
#[derive(Debug)]
struct ReplyTarget {
    entry: EntryMemory,
    unique: u64,
    /// Where the reply's data is put: past the request's own bytes in the payload.
    data_offset: usize,
    /// Data bytes written, once replied.
    replied: Option<usize>,
}

// SAFETY: the pointers refer to the queue's memory, which outlives every armed target
// (the worker disarms before it hands the entry back or frees the memory).
unsafe impl Send for ReplyTarget {}

/// The reply sink of one entry, armed while the entry's request is being served.
#[derive(Debug, Default)]
pub struct EntrySink {
    target: Mutex<Option<ReplyTarget>>,
}

/// What became of the reply to a served request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replied {
    /// A reply with this many data bytes is in place.
    Data(usize),
    /// No reply came (the request type has none, or it was lost).
    Nothing,
}

impl EntrySink {
    /// Takes replies for request `rebuilt` on `entry` until `disarm`.
    pub fn arm(&self, entry: EntryMemory, rebuilt: &Rebuilt) {
        let data_offset = rebuilt.payload_in_bytes.next_multiple_of(8);
        *self.target.lock() = Some(ReplyTarget {
            entry,
            unique: rebuilt.unique,
            data_offset,
            replied: None,
        });
    }

    /// Stops taking replies, and moves the reply's data to the start of the payload,
    /// where the kernel reads it. Call after the request's bytes are no longer borrowed.
    pub fn disarm(&self) -> Replied {
        let Some(target) = self.target.lock().take() else {
            return Replied::Nothing;
        };
        let Some(bytes) = target.replied else {
            return Replied::Nothing;
        };
        if target.data_offset != 0 && bytes != 0 {
            // SAFETY: both ranges lie inside the entry's payload and slack (checked when
            // written); `copy` allows overlap.
            unsafe {
                let payload = target.entry.payload_ptr();
                std::ptr::copy(payload.add(target.data_offset), payload, bytes);
            }
        }
        Replied::Data(bytes)
    }
}

impl fuser::ReplySink for EntrySink {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut guard = self.target.lock();
        let Some(target) = guard.as_mut() else {
            return Err(io::Error::other(
                "reply after its ring entry was handed back",
            ));
        };
        if target.replied.is_some() {
            return Err(io::Error::other("second reply to one request"));
        }
        let total: usize = data.iter().map(|slice| slice.len()).sum();
        let data_bytes = total.saturating_sub(OUT_HEADER_BYTES);
        // The slack page past the payload takes small replies to requests that fill it.
        let room = target.entry.payload_bytes + PAGE_BYTES;
        let fits = data_bytes <= target.entry.payload_bytes
            && target.data_offset + data_bytes <= room
            && total >= OUT_HEADER_BYTES;
        if !fits {
            target.entry.write_error(target.unique, libc::EIO);
            target.replied = Some(0);
            target.data_offset = 0;
            return Err(io::Error::other(format!(
                "reply of {total} bytes does not fit the ring entry"
            )));
        }
        write_reply(target, data);
        target.replied = Some(data_bytes);
        Ok(())
    }
}

/// Copies a reply (out header, then data) into the entry: the header into the header
/// buffer, the data into the payload at the target's data offset.
fn write_reply(target: &ReplyTarget, data: &[IoSlice<'_>]) {
    let header = target.entry.header_ptr().cast::<u8>();
    // SAFETY: the data offset plus the data fit the payload and slack (checked by the
    // caller).
    let payload = unsafe { target.entry.payload_ptr().add(target.data_offset) };
    let mut position = 0usize;
    for slice in data {
        let mut bytes: &[u8] = slice;
        let mut at = position;
        if at < OUT_HEADER_BYTES {
            let head = (OUT_HEADER_BYTES - at).min(bytes.len());
            // SAFETY: at + head <= 16, inside the header buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), header.add(at), head) };
            bytes = &bytes[head..];
            at += head;
        }
        if !bytes.is_empty() {
            let to = at - OUT_HEADER_BYTES;
            // SAFETY: to + len <= the reply's data bytes, inside the checked range.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), payload.add(to), bytes.len()) };
        }
        position += slice.len();
    }
    let data_bytes = position.saturating_sub(OUT_HEADER_BYTES);
    // SAFETY: the entry is with the daemon; the header is plain data.
    unsafe { (*target.entry.header_ptr()).ent_in_out.payload_bytes = data_bytes as u32 };
}

#[cfg(test)]
mod tests {
    use fuser::ReplySink;

    use super::*;

    /// Puts a request into entry `entry` as the kernel would: in header, per-opcode struct
    /// in `op_in`, the rest in the payload.
    fn kernel_writes(entry: EntryMemory, unique: u64, op_in: &[u8], payload: &[u8]) {
        let len = (IN_HEADER_BYTES + op_in.len() + payload.len()) as u32;
        // SAFETY: test memory, not registered with any kernel.
        unsafe {
            let header = &mut *entry.header_ptr();
            header.in_out[..4].copy_from_slice(&len.to_le_bytes());
            header.in_out[4..8].copy_from_slice(&15u32.to_le_bytes());
            header.in_out[8..16].copy_from_slice(&unique.to_le_bytes());
            header.op_in[..op_in.len()].copy_from_slice(op_in);
            header.ent_in_out.commit_id = unique;
            header.ent_in_out.payload_bytes = payload.len() as u32;
            let to = entry.payload_ptr();
            std::ptr::copy_nonoverlapping(payload.as_ptr(), to, payload.len());
        }
    }

    fn header_and_data(entry: EntryMemory) -> (abi::OutHeader, Vec<u8>) {
        // SAFETY: test memory.
        unsafe {
            let header = entry.header_ptr();
            let out = header.cast::<abi::OutHeader>().read();
            let bytes = (*header).ent_in_out.payload_bytes as usize;
            let data = std::slice::from_raw_parts(entry.payload_ptr(), bytes).to_vec();
            (out, data)
        }
    }

    // A request reads back as /dev/fuse would give it: header, op struct, payload in one
    // aligned slice whose payload part is the registered buffer itself.
    #[test]
    fn requests_are_rebuilt_contiguously() {
        let memory = QueueMemory::new(2, 2 * PAGE_BYTES).unwrap();
        let entry = memory.entry(1);
        let op_in: Vec<u8> = (0..40).collect();
        let payload = vec![7u8; 5000];
        kernel_writes(entry, 99, &op_in, &payload);
        let rebuilt = entry.rebuild().unwrap();
        assert_eq!((rebuilt.unique, rebuilt.commit_id), (99, 99));
        assert_eq!(rebuilt.len, IN_HEADER_BYTES + 40 + 5000);
        assert_eq!(rebuilt.offset % 8, 0);
        // SAFETY: rebuilt from this entry, which nothing else touches.
        let bytes = unsafe { entry.request(&rebuilt) };
        assert_eq!(
            &bytes[IN_HEADER_BYTES..IN_HEADER_BYTES + 40],
            op_in.as_slice()
        );
        assert_eq!(&bytes[IN_HEADER_BYTES + 40..], payload.as_slice());
        let data_start = bytes[IN_HEADER_BYTES + 40..].as_ptr();
        assert_eq!(data_start, entry.payload_ptr().cast_const());
        assert_eq!(
            data_start as usize % PAGE_BYTES,
            0,
            "write data is page aligned"
        );
    }

    // Lengths that do not add up, or a payload larger than the buffer, are refused.
    #[test]
    fn malformed_requests_are_refused() {
        let memory = QueueMemory::new(1, 2 * PAGE_BYTES).unwrap();
        let entry = memory.entry(0);
        kernel_writes(entry, 5, &[0; 8], &[1; 16]);
        // SAFETY: test memory.
        unsafe { (*entry.header_ptr()).ent_in_out.payload_bytes = 4096 };
        assert!(entry.rebuild().is_err());
        kernel_writes(entry, 5, &[0; 8], &[]);
        // SAFETY: test memory.
        unsafe { (&mut (*entry.header_ptr()).in_out)[..4].copy_from_slice(&400u32.to_le_bytes()) };
        assert!(entry.rebuild().is_err(), "an op struct over 128 bytes");
    }

    // A reply lands as header plus data; data for a request with a payload of its own is
    // written past it and moved to the start on disarm; one reply only, none after.
    #[test]
    fn replies_land_in_the_entry() {
        let memory = QueueMemory::new(1, 2 * PAGE_BYTES).unwrap();
        let entry = memory.entry(0);
        let sink = EntrySink::default();
        kernel_writes(entry, 11, &[0; 40], &[3; 2 * PAGE_BYTES]);
        let rebuilt = entry.rebuild().unwrap();
        sink.arm(entry, &rebuilt);
        let out = abi::OutHeader {
            len: 24,
            error: 0,
            unique: 11,
        };
        // SAFETY: OutHeader is plain data.
        let out_bytes: [u8; 16] = unsafe { std::mem::transmute(out) };
        let data = [9u8; 8];
        sink.send(&[
            IoSlice::new(&out_bytes[..10]),
            IoSlice::new(&out_bytes[10..]),
            IoSlice::new(&data),
        ])
        .unwrap();
        assert!(
            sink.send(&[IoSlice::new(&out_bytes)]).is_err(),
            "second reply"
        );
        assert_eq!(sink.disarm(), Replied::Data(8));
        assert_eq!(header_and_data(entry), (out, data.to_vec()));
        assert!(
            sink.send(&[IoSlice::new(&out_bytes)]).is_err(),
            "reply after disarm"
        );
        assert_eq!(sink.disarm(), Replied::Nothing);
    }

    // A reply larger than the payload buffer becomes EIO.
    #[test]
    fn oversized_replies_become_errors() {
        let memory = QueueMemory::new(1, 2 * PAGE_BYTES).unwrap();
        let entry = memory.entry(0);
        let sink = EntrySink::default();
        kernel_writes(entry, 12, &[0; 24], &[]);
        sink.arm(entry, &entry.rebuild().unwrap());
        let big = vec![0u8; 16 + 3 * PAGE_BYTES];
        assert!(sink.send(&[IoSlice::new(&big)]).is_err());
        assert_eq!(sink.disarm(), Replied::Data(0));
        let (out, data) = header_and_data(entry);
        assert_eq!((out.error, out.unique, data.len()), (-libc::EIO, 12, 0));
    }
}
