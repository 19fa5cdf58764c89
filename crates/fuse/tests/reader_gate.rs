//! The worker threads' reading rule (vendor/fuser/src/reader_gate.rs, a cairn patch): one
//! thread reads while requests come one at a time; a parked thread is called when requests
//! queue behind one that is not short, takes over requests nobody reads, and leaves when the
//! session closes; a thread done while requests queue reads too. A pipe
//! stands in for `/dev/fuse` (both are ready for `poll` when a read would not wait).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::ReaderGate;

fn pipe() -> (Arc<OwnedFd>, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two new descriptors, each then owned once.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe(2), owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    (Arc::new(read), write)
}

/// Reads the byte standing for a queued request, as the called thread's `read` would.
fn take_request(device: &OwnedFd) {
    let mut byte = 0u8;
    // SAFETY: reads one byte into a local from a descriptor this test owns.
    let read = unsafe { libc::read(device.as_raw_fd(), (&raw mut byte).cast(), 1) };
    assert_eq!(read, 1);
}

/// Waits (polling, a bounded while) until `done` holds.
fn eventually(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "never happened");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn spawn_waiter(gate: &Arc<ReaderGate>, device: &Arc<OwnedFd>) -> JoinHandle<bool> {
    let (gate, device) = (Arc::clone(gate), Arc::clone(device));
    std::thread::spawn(move || gate.wait_turn(device.as_fd()))
}

/// A gate whose one reader (this thread) just took a request with nothing queued behind it,
/// and a second thread parked: the state both tests start from.
fn reader_with_a_parked_thread() -> (Arc<OwnedFd>, File, Arc<ReaderGate>, JoinHandle<bool>) {
    let (device, writer) = pipe();
    let gate = Arc::new(ReaderGate::new());
    assert!(gate.wait_turn(device.as_fd()));
    let follower = spawn_waiter(&gate, &device);
    eventually(|| gate.parked() == 1);
    gate.received(device.as_fd(), &[]);
    (device, writer, gate, follower)
}

// One thread reads while nothing is queued; a second parks until the reader sees a queued
// request, then is called; closing the session releases parked threads.
#[test]
fn a_parked_thread_is_called_only_when_requests_queue() {
    // The reader took a request with nothing behind it: nobody is called, and the same
    // thread reads again.
    let (device, mut writer, gate, follower) = reader_with_a_parked_thread();
    assert!(gate.wait_turn(device.as_fd()));
    assert_eq!(gate.parked(), 1);
    // Requests queue behind the one it takes: the parked thread is called.
    writer.write_all(b"x").unwrap();
    gate.received(device.as_fd(), &[]);
    assert!(follower.join().unwrap());
    assert_eq!(gate.readers(), 1);
    take_request(&device);
    let parked = spawn_waiter(&gate, &device);
    eventually(|| gate.parked() == 1);
    gate.close();
    assert!(!parked.join().unwrap());
    assert!(
        !gate.wait_turn(device.as_fd()),
        "nothing reads once the session closed"
    );
}

// A parked thread takes over requests nobody reads while every reader is busy with a long
// request (one that arrived when nothing else was queued).
#[test]
fn requests_behind_a_long_one_are_read_by_a_parked_thread() {
    let (_device, mut writer, gate, follower) = reader_with_a_parked_thread();
    writer.write_all(b"x").unwrap();
    assert!(follower.join().unwrap());
    assert_eq!(gate.readers(), 1);
}

// The reader's spin before a blocking read: it finds a queued request at once, gives up
// when none comes, and adapts between zero and its most as the kernel's halt polling does
// (doubling after a read that waited less than the most, halving after a longer one).
#[test]
fn the_reader_spin_adapts_to_how_soon_requests_come() {
    let (device, mut writer) = pipe();
    let most = Duration::from_micros(50);
    let gate = ReaderGate::with_spin(most);
    assert_eq!(gate.spin(), most);
    // This thread is the lone reader: it spins, and finds nothing.
    assert!(gate.wait_turn(device.as_fd()));
    assert!(!gate.spin_for_request(device.as_fd()));
    writer.write_all(b"request").unwrap();
    assert!(gate.spin_for_request(device.as_fd()));

    // Requests long after each read: the spin halves down to nothing.
    for _ in 0..20 {
        gate.read_waited(Duration::from_millis(5));
    }
    assert_eq!(gate.spin(), Duration::ZERO);
    // Requests soon after: it grows back, never past the most.
    gate.read_waited(Duration::from_micros(3));
    assert!(gate.spin() > Duration::ZERO);
    for _ in 0..20 {
        gate.read_waited(Duration::from_micros(1));
    }
    assert_eq!(gate.spin(), most);

    // A gate without a spin never spins.
    let quiet = ReaderGate::new();
    quiet.read_waited(Duration::from_micros(1));
    assert_eq!(quiet.spin(), Duration::ZERO);
}

/// A raw request of `opcode` (a `fuse_in_header` of 40 bytes), with `body` after it.
#[allow(clippy::host_endian_bytes)] // the kernel's FUSE structures are in host byte order
fn request(opcode: u32, body: &[u8]) -> Vec<u8> {
    let mut raw = vec![0u8; 40];
    raw[0..4].copy_from_slice(&(40 + body.len() as u32).to_ne_bytes());
    raw[4..8].copy_from_slice(&opcode.to_ne_bytes());
    raw.extend_from_slice(body);
    raw
}

// A reader holding a short request (a lookup, an unlink, a forget...) takes what queued behind
// it itself instead of calling a parked thread; one holding a longer one (a write, a
// truncating setattr) calls it.
#[test]
fn a_short_request_in_hand_calls_no_parked_thread() {
    const LOOKUP: u32 = 1;
    const SETATTR: u32 = 4;
    const OPEN: u32 = 14;
    const WRITE: u32 = 16;
    #[allow(clippy::host_endian_bytes)] // fuse_setattr_in's `valid`, in host byte order
    let setattr = |valid: u32| request(SETATTR, &valid.to_ne_bytes());
    let (device, mut writer, gate, follower) = reader_with_a_parked_thread();
    writer.write_all(b"x").unwrap();
    // This thread holds the request it got with the parked thread still parked.
    assert!(gate.wait_turn(device.as_fd()));
    for short in [request(LOOKUP, b"name\0"), setattr(1 << 4)] {
        gate.received(device.as_fd(), &short);
        assert_eq!(gate.parked(), 1, "called for a short request");
        assert!(gate.wait_turn(device.as_fd()));
    }
    gate.received(device.as_fd(), &setattr(1 << 3)); // FATTR_SIZE: a truncation
    assert!(follower.join().unwrap());
    assert!(fuser::is_short_request(&request(LOOKUP, &[])));
    assert!(!fuser::is_short_request(&request(WRITE, &[0; 40])));
    assert!(
        !fuser::is_short_request(&request(SETATTR, &[])),
        "no body: not known short"
    );
    assert!(
        !fuser::is_short_request(&[1, 0]),
        "a torn header is not short"
    );
    // fuse_open_in's flags: an open that truncates may free a big file.
    #[allow(clippy::host_endian_bytes)] // fuse_open_in's `flags`, in host byte order
    let open = |flags: i32| request(OPEN, &[flags.to_ne_bytes(), [0; 4]].concat());
    assert!(fuser::is_short_request(&open(libc::O_RDWR)));
    assert!(!fuser::is_short_request(&open(
        libc::O_RDWR | libc::O_TRUNC
    )));
}

// A thread done with its request while another reads parks when nothing is queued, and reads
// too when requests are: under a steady backlog no thread parks only to be called back.
#[test]
fn a_thread_done_while_requests_queue_reads_too() {
    let (device, mut writer) = pipe();
    let gate = Arc::new(ReaderGate::new());
    assert!(gate.wait_turn(device.as_fd()));
    let parked = spawn_waiter(&gate, &device);
    eventually(|| gate.parked() == 1);
    writer.write_all(b"x").unwrap();
    assert!(gate.wait_turn(device.as_fd()), "joins the reader");
    assert_eq!((gate.readers(), gate.parked()), (2, 1));
    gate.close();
    assert!(!parked.join().unwrap());
}

// With reads handed over (cairn answers a READ with requests waiting from the device's
// completion thread), a reader holding a READ takes what queued behind it itself; without,
// the READ is a long request and a parked thread is called.
#[test]
fn a_read_handed_over_calls_no_parked_thread() {
    const READ: u32 = 15;
    let read = request(READ, &[0; 40]);
    let (device, mut writer) = pipe();
    let gate = Arc::new(ReaderGate::new().with_reads_handed_over(true));
    assert!(gate.wait_turn(device.as_fd()));
    let follower = spawn_waiter(&gate, &device);
    eventually(|| gate.parked() == 1);
    writer.write_all(b"x").unwrap();
    gate.received(device.as_fd(), &read);
    assert_eq!(gate.parked(), 1, "called for a READ handed over");
    gate.close();
    assert!(!follower.join().unwrap());

    let (device, mut writer, gate, follower) = reader_with_a_parked_thread();
    writer.write_all(b"x").unwrap();
    assert!(gate.wait_turn(device.as_fd()));
    gate.received(device.as_fd(), &read);
    assert!(
        follower.join().unwrap(),
        "a READ answered by its reader is a long request"
    );
}
