//! One ring queue: its io_uring, its entries, and the worker thread that serves them.
//! The worker submits every reply together with the fetch of the entry's next request
//! (COMMIT_AND_FETCH) and waits for completions in the same `io_uring_enter`, so a busy
//! queue costs one system call per batch of requests rather than two per request.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fuser::{Dispatched, Dispatcher, Filesystem};
use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::abi::{self, CMD_COMMIT_AND_FETCH, CMD_REGISTER};
use super::entry::{EntryMemory, EntrySink, QueueMemory, Rebuilt, Replied};

/// The ring of one queue: 128-byte SQEs (the FUSE command needs 80 bytes of them).
pub type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Times a REGISTER refused with `EAGAIN` (connection not initialised yet) is retried.
const REGISTER_RETRIES: u32 = 1000;

/// A queue set up before the FUSE handshake: ring and buffers, nothing registered.
pub struct QueueSetup {
    pub qid: u16,
    ring: Ring,
    memory: QueueMemory,
}

impl QueueSetup {
    /// A ring with room for `depth` entries of `payload_bytes` each.
    pub fn new(qid: u16, depth: usize, payload_bytes: usize) -> io::Result<QueueSetup> {
        let entries = u32::try_from(depth).map_err(io::Error::other)?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(entries * 2)
            .build(entries)?;
        let memory = QueueMemory::new(depth, payload_bytes)?;
        Ok(QueueSetup { qid, ring, memory })
    }
}

/// The last command submitted for an entry, to resubmit it after `EAGAIN`/`EINTR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Register,
    Commit(u64),
    /// The entry ended with the connection (or was refused for good).
    Ended,
}

/// A queue being served.
pub struct Worker<FS: Filesystem> {
    qid: u16,
    ring: Ring,
    memory: QueueMemory,
    /// REGISTER's iovec pairs, which the kernel reads while the SQE is issued.
    iovecs: Box<[[libc::iovec; 2]]>,
    sinks: Vec<Arc<EntrySink>>,
    commands: Vec<Command>,
    fuse_fd: RawFd,
    dispatcher: Arc<Dispatcher<FS>>,
    served: Arc<AtomicU64>,
    /// Aligned room for a request whose header does not end on 8 bytes (none does today).
    scratch: Vec<u64>,
    completions: Vec<(u64, i32)>,
}

// SAFETY: the iovecs point into `memory`, which the worker owns and moves with it.
unsafe impl<FS: Filesystem> Send for Worker<FS> {}

impl std::fmt::Debug for QueueSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSetup")
            .field("qid", &self.qid)
            .finish_non_exhaustive()
    }
}

impl<FS: Filesystem> std::fmt::Debug for Worker<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("qid", &self.qid)
            .finish_non_exhaustive()
    }
}

/// How registration went on one queue.
pub type Registered = Result<(), String>;

impl<FS: Filesystem> Worker<FS> {
    pub fn new(
        setup: QueueSetup,
        fuse_fd: RawFd,
        dispatcher: Arc<Dispatcher<FS>>,
        served: Arc<AtomicU64>,
    ) -> Self {
        let depth = setup.memory.depth();
        let iovecs = (0..depth).map(|i| setup.memory.entry(i).iovecs()).collect();
        Worker {
            qid: setup.qid,
            ring: setup.ring,
            memory: setup.memory,
            iovecs,
            sinks: (0..depth).map(|_| Arc::new(EntrySink::default())).collect(),
            commands: vec![Command::Register; depth],
            fuse_fd,
            dispatcher,
            served,
            scratch: Vec::new(),
            completions: Vec::with_capacity(depth * 2),
        }
    }

    /// Registers every entry; an error names the kernel's refusal (it then serves the
    /// connection through `/dev/fuse` itself).
    pub fn register(&mut self) -> Registered {
        for index in 0..self.commands.len() {
            self.push(index, Command::Register);
        }
        self.ring
            .submit()
            .map_err(|e| format!("submitting ring entries: {e}"))?;
        self.collect();
        let mut refused = None;
        let mut retries = 0;
        let mut index = 0;
        while index < self.completions.len() {
            let (entry, result) = self.completions[index];
            let again = [-libc::EAGAIN, -libc::EINTR].contains(&result);
            if again && retries < REGISTER_RETRIES {
                retries += 1;
                self.completions.swap_remove(index);
                self.push(entry as usize, Command::Register);
                let _ = self.ring.submit();
                self.collect();
                continue;
            }
            if result < 0 {
                refused.get_or_insert(io::Error::from_raw_os_error(-result));
                self.commands[entry as usize] = Command::Ended;
                self.completions.swap_remove(index);
                continue;
            }
            index += 1;
        }
        match refused {
            Some(error) => Err(format!("the kernel refused the ring entries: {error}")),
            None => Ok(()),
        }
    }

    /// Serves requests until every entry has ended with the connection.
    pub fn serve(mut self) {
        let mut pending = std::mem::take(&mut self.completions);
        loop {
            for (entry, result) in pending.drain(..) {
                self.complete(entry as usize, result);
            }
            if self.commands.iter().all(|c| *c == Command::Ended) {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(error) => {
                    tracing::error!(queue = self.qid, %error, "io_uring_enter failed");
                    break;
                }
            }
            self.collect();
            std::mem::swap(&mut pending, &mut self.completions);
        }
        tracing::debug!(queue = self.qid, "ring queue ended");
        let ended = self.commands.iter().all(|c| *c == Command::Ended);
        let Worker { ring, memory, .. } = self;
        drop(ring);
        if !ended {
            // The kernel may still hold entries (the loop stopped on an error): leave their
            // buffers allocated rather than free them under it.
            std::mem::forget(memory);
        }
    }

    /// Moves the completions the kernel posted into `self.completions`.
    fn collect(&mut self) {
        for cqe in self.ring.completion() {
            self.completions.push((cqe.user_data(), cqe.result()));
        }
    }

    /// Handles one completion of entry `index`.
    fn complete(&mut self, index: usize, result: i32) {
        let Some(&last) = self.commands.get(index) else {
            tracing::error!(queue = self.qid, index, "completion for no ring entry");
            return;
        };
        match result {
            0.. => {
                let commit_id = self.serve_entry(index);
                self.push(index, Command::Commit(commit_id));
            }
            _ if result == -libc::EAGAIN || result == -libc::EINTR => self.push(index, last),
            _ if [
                libc::ENOTCONN,
                libc::ECONNABORTED,
                libc::ECANCELED,
                libc::ENODEV,
            ]
            .contains(&-result) =>
            {
                self.commands[index] = Command::Ended;
            }
            _ => self.recover(index, last, result),
        }
    }

    /// An entry the kernel refused unexpectedly: a refused commit hands the buffers over
    /// again as a new entry; a refused registration ends it.
    fn recover(&mut self, index: usize, last: Command, result: i32) {
        let error = io::Error::from_raw_os_error(-result);
        match last {
            Command::Commit(_) => {
                tracing::warn!(queue = self.qid, index, %error, "ring commit refused");
                self.push(index, Command::Register);
            }
            Command::Register | Command::Ended => {
                tracing::error!(queue = self.qid, index, %error, "ring entry refused");
                self.commands[index] = Command::Ended;
            }
        }
    }

    /// Serves the request in entry `index` and leaves its reply there; returns the id
    /// to commit it with.
    fn serve_entry(&mut self, index: usize) -> u64 {
        self.served.fetch_add(1, Ordering::Relaxed);
        let entry = self.memory.entry(index);
        let rebuilt = match entry.rebuild() {
            Ok(rebuilt) => rebuilt,
            Err(malformed) => {
                tracing::error!(queue = self.qid, %malformed, "ring request refused");
                // SAFETY: the entry is with the daemon; the header is plain data.
                let header = unsafe { entry.header_ptr().read() };
                let (_, unique) = abi::in_header_fields(&header.in_out);
                entry.write_error(unique, libc::EIO);
                return header.ent_in_out.commit_id;
            }
        };
        let sink = Arc::clone(&self.sinks[index]);
        sink.arm(entry, &rebuilt);
        let outcome = self.dispatch(entry, &rebuilt, &sink);
        let replied = sink.disarm();
        match (outcome, replied) {
            (Dispatched::Invalid, _) => entry.write_error(rebuilt.unique, libc::EIO),
            (_, Replied::Nothing) => entry.write_error(rebuilt.unique, libc::ENOSYS),
            (_, Replied::Data(_)) => {}
        }
        rebuilt.commit_id
    }

    /// Hands the rebuilt request to fuser's decoder and the filesystem.
    fn dispatch(
        &mut self,
        entry: EntryMemory,
        rebuilt: &Rebuilt,
        sink: &Arc<EntrySink>,
    ) -> Dispatched {
        let sink: Arc<dyn fuser::ReplySink> = Arc::clone(sink) as Arc<dyn fuser::ReplySink>;
        if rebuilt.offset.is_multiple_of(8) {
            // SAFETY: rebuilt from this entry, which stays with the daemon until the commit
            // below; the sink writes the reply past the request's bytes.
            let request = unsafe { entry.request(rebuilt) };
            return self.dispatcher.dispatch(request, sink);
        }
        // fuser decodes headers in place and needs them 8-byte aligned.
        self.scratch.clear();
        self.scratch.resize(rebuilt.len.div_ceil(8), 0);
        // SAFETY: as above; the scratch has room for len bytes.
        unsafe {
            let request = entry.request(rebuilt);
            let to = self.scratch.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(request.as_ptr(), to, rebuilt.len);
        }
        // SAFETY: the scratch holds len initialised bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.scratch.as_ptr().cast::<u8>(), rebuilt.len) };
        self.dispatcher.dispatch(bytes, sink)
    }

    /// Queues `command` for entry `index` (submitted with the next `io_uring_enter`).
    fn push(&mut self, index: usize, command: Command) {
        self.commands[index] = command;
        let (op, commit_id) = match command {
            Command::Register => (CMD_REGISTER, 0),
            Command::Commit(commit_id) => (CMD_COMMIT_AND_FETCH, commit_id),
            Command::Ended => return,
        };
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.fuse_fd), op)
            .cmd(abi::command(commit_id, self.qid))
            .build()
            .user_data(index as u64);
        if command == Command::Register {
            sqe = with_iovecs(sqe, &self.iovecs[index]);
        }
        // SAFETY: the SQE's iovecs live in `self.iovecs` and the buffers in `self.memory`,
        // both kept until the worker ends, after the kernel is done with every entry.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            // The SQ holds as many entries as the queue, so this is a full batch.
            if let Err(error) = self.ring.submit() {
                tracing::error!(queue = self.qid, %error, "io_uring submit failed");
                self.commands[index] = Command::Ended;
                return;
            }
        }
    }
}

/// REGISTER carries its buffers as an iovec array in `addr` and their count in `len`;
/// the io-uring crate's `UringCmd80` sets `addr` but not `len`, which is at byte 24 of
/// the SQE (`struct io_uring_sqe`).
fn with_iovecs(sqe: squeue::Entry128, iovecs: &[libc::iovec; 2]) -> squeue::Entry128 {
    const LEN_OFFSET: usize = 24;
    const ADDR_OFFSET: usize = 16;
    // SAFETY: Entry128 is repr(C), 128 bytes of plain integers (asserted by the crate).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    let addr = iovecs.as_ptr() as u64;
    // SAFETY: both fields lie inside the 128 bytes.
    unsafe {
        raw.as_mut_ptr()
            .add(ADDR_OFFSET)
            .cast::<u64>()
            .write_unaligned(addr);
        raw.as_mut_ptr()
            .add(LEN_OFFSET)
            .cast::<u32>()
            .write_unaligned(2);
    }
    // SAFETY: any 128 bytes are a valid Entry128.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Submits one REGISTER for queue `setup.qid` (one the kernel does not have) so that the
/// kernel refuses it; returns the kernel's answer. Should the kernel take the entry after
/// all, its buffers are leaked rather than freed under it.
pub fn refuse_register(mut setup: QueueSetup, fuse_fd: RawFd) -> io::Result<i32> {
    let iovecs = Box::new(setup.memory.entry(0).iovecs());
    let sqe = opcode::UringCmd80::new(types::Fd(fuse_fd), CMD_REGISTER)
        .cmd(abi::command(0, setup.qid))
        .build();
    let sqe = with_iovecs(sqe, &iovecs);
    // SAFETY: the iovecs and buffers outlive the SQE (leaked below unless refused).
    unsafe { setup.ring.submission().push(&sqe) }.map_err(io::Error::other)?;
    setup.ring.submit()?;
    let answer = setup.ring.completion().next().map(|cqe| cqe.result());
    match answer {
        Some(result) if result < 0 => Ok(result),
        _ => {
            std::mem::forget(iovecs);
            std::mem::forget(setup);
            Err(io::Error::other(
                "the kernel took a ring entry for a queue it lacks",
            ))
        }
    }
}
