//! The kernel's FUSE-over-io_uring interface (`include/uapi/linux/fuse.h`, protocol 7.42),
//! as far as the transport uses it. Native byte order: these structures never leave the
//! machine.

/// `FUSE_IO_URING_CMD_REGISTER`: hand an entry's buffers to a queue and wait for a request.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: reply to the entry's request and wait for the next.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_in_header`: the header a request starts with.
pub const IN_HEADER_BYTES: usize = 40;
/// `struct fuse_out_header`: the header a reply starts with.
pub const OUT_HEADER_BYTES: usize = 16;
/// Room for the per-opcode argument struct in the entry header (`op_in`).
pub const OP_IN_BYTES: usize = 128;
/// The kernel's smallest payload buffer (`FUSE_MIN_READ_BUFFER`).
pub const PAYLOAD_MIN_BYTES: usize = 8192;

/// `struct fuse_uring_ent_in_out`: per-request bookkeeping in the entry header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EntInOut {
    pub flags: u64,
    /// The id a commit names the request by (the request's `unique`).
    pub commit_id: u64,
    /// Bytes in the payload buffer: the request's arguments after `op_in` on the way in,
    /// the reply's data on the way out.
    pub payload_bytes: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the header buffer of a ring entry (`iov[0]` of
/// REGISTER).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReqHeader {
    /// `fuse_in_header` of a request; `fuse_out_header` of its reply.
    pub in_out: [u8; 128],
    /// The request's first argument, its per-opcode struct (empty for some opcodes).
    pub op_in: [u8; OP_IN_BYTES],
    pub ent_in_out: EntInOut,
}

const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);

/// `struct fuse_uring_cmd_req`: the command in the 80-byte area of the SQE.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

/// The fields of `struct fuse_in_header` the transport reads.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct InHeader {
    len: u32,
    opcode: u32,
    unique: u64,
}

/// `struct fuse_out_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

const _: () = assert!(size_of::<CmdReq>() == 24);
const _: () = assert!(size_of::<OutHeader>() == OUT_HEADER_BYTES);

/// The 80-byte command area of a REGISTER or COMMIT_AND_FETCH SQE.
pub fn command(commit_id: u64, queue: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    let req = CmdReq {
        flags: 0,
        commit_id,
        qid: queue,
        padding: [0; 6],
    };
    // SAFETY: CmdReq is 24 bytes of plain integers; the area has 80.
    unsafe { cmd.as_mut_ptr().cast::<CmdReq>().write_unaligned(req) };
    cmd
}

/// The fields of a `fuse_in_header` the transport needs: total length and unique id.
pub fn in_header_fields(in_out: &[u8; 128]) -> (u32, u64) {
    // SAFETY: InHeader is 16 bytes of plain integers, inside the 128.
    let header = unsafe { in_out.as_ptr().cast::<InHeader>().read_unaligned() };
    (header.len, header.unique)
}

/// A `fuse_out_header` that answers request `unique` with error `errno` and no data.
pub fn error_header(unique: u64, errno: i32) -> OutHeader {
    OutHeader {
        len: OUT_HEADER_BYTES as u32,
        error: -errno,
        unique,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The command area carries the commit id at byte 8 and the queue at byte 16.
    #[test]
    fn command_layout() {
        let cmd = command(0x0102_0304_0506_0708, 3);
        // SAFETY: reading back the struct just written.
        let req = unsafe { cmd.as_ptr().cast::<CmdReq>().read_unaligned() };
        assert_eq!(
            (req.flags, req.commit_id, req.qid),
            (0, 0x0102_0304_0506_0708, 3)
        );
        assert_eq!(std::mem::offset_of!(CmdReq, commit_id), 8);
        assert_eq!(std::mem::offset_of!(CmdReq, qid), 16);
        assert!(cmd[18..].iter().all(|b| *b == 0));
    }

    // The in header's length and id sit where the kernel puts them.
    #[test]
    fn in_header_layout() {
        assert_eq!(std::mem::offset_of!(InHeader, unique), 8);
        let mut in_out = [0u8; 128];
        let header = InHeader {
            len: 56,
            opcode: 3,
            unique: 77,
        };
        // SAFETY: 16 bytes of plain integers into 128.
        unsafe {
            in_out
                .as_mut_ptr()
                .cast::<InHeader>()
                .write_unaligned(header)
        };
        assert_eq!(in_header_fields(&in_out), (56, 77));
        let out = error_header(77, libc::EIO);
        assert_eq!((out.len, out.error, out.unique), (16, -libc::EIO, 77));
    }
}
