//! `FileDevice` against real files under /tmp (where `O_DIRECT` works), tmpfs and procfs.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError, DeviceKind, FileDevice, OpenOptions};

const MIB: u64 = 1 << 20;

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cairn-blockdev-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn filled(len: usize, seed: u8) -> AlignedBuf {
    let bytes: Vec<u8> = (0..len)
        .map(|index| (index as u8).wrapping_mul(31) ^ seed)
        .collect();
    AlignedBuf::from_slice(&bytes)
}

fn read(device: &(impl BlockDevice + ?Sized), offset: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    device.read_at(offset, &mut buf).unwrap();
    buf
}

fn create(path: &Path, size: u64) -> FileDevice {
    FileDevice::open(path, &OpenOptions::new().create_size(size)).unwrap()
}

// `read_into` and `write_from` move data to and from any memory: part of a larger aligned
// buffer (straight through O_DIRECT) and unaligned slices (through a bounce buffer), on the
// file device and the memory device alike; misaligned device offsets are still refused.
#[test]
fn slices_in_and_out_aligned_or_not() {
    let dir = temp_dir();
    let file = create(&dir.path().join("image"), 4 * MIB);
    let mem = cairn_blockdev::MemDevice::new(4 * MIB, 4096);
    let devices: [&dyn BlockDevice; 2] = [&file, &mem];
    for device in devices {
        let data = filled(3 * 4096 + 1, 7);
        device.write_from(4096, &data[..8192]).unwrap();
        device.write_from(3 * 4096, &data[1..4097]).unwrap();
        let mut whole = AlignedBuf::zeroed(5 * 4096);
        device.read_into(4096, &mut whole[4096..4 * 4096]).unwrap();
        assert_eq!(&whole[4096..3 * 4096], &data[..8192]);
        assert_eq!(&whole[3 * 4096..4 * 4096], &data[1..4097]);
        let mut odd = vec![0u8; 4097];
        device.read_into(3 * 4096, &mut odd[1..]).unwrap();
        assert_eq!(&odd[1..], &data[1..4097]);
        assert!(device.read_into(100, &mut whole[..4096]).is_err());
        assert!(device.write_from(100, &data[..4096]).is_err());
    }
}

// Checks write/read round trips at several offsets, and that data survives a reopen.
#[test]
fn round_trip_at_several_offsets() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    let offsets = [0, 12288, 3 * MIB, 8 * MIB - 8192];
    {
        let device = create(&path, 8 * MIB);
        assert_eq!(device.kind(), DeviceKind::ImageFile);
        assert!(device.direct());
        assert_eq!(device.path(), path);
        assert_eq!(device.size_bytes(), 8 * MIB);
        assert_eq!(device.logical_sector_size(), 4096);
        assert_eq!(device.physical_sector_size(), 4096);
        for (index, &offset) in offsets.iter().enumerate() {
            device.write_at(offset, &filled(8192, index as u8)).unwrap();
        }
        device.flush().unwrap();
        assert_eq!(read(&device, 4 * MIB, 4096), AlignedBuf::zeroed(4096));
    }
    let device = FileDevice::open(&path, &OpenOptions::new()).unwrap();
    for (index, &offset) in offsets.iter().enumerate() {
        assert_eq!(read(&device, offset, 8192), filled(8192, index as u8));
    }
}

// Checks that misaligned and out-of-range transfers are refused with typed errors.
#[test]
fn misaligned_and_out_of_range_are_refused() {
    let dir = temp_dir();
    let device = create(&dir.path().join("image"), MIB);
    let buf = filled(4096, 1);
    let misaligned = [(512, 4096), (0, 512), (4095, 4096)];
    for (offset, len) in misaligned {
        let result = device.write_at(offset, &filled(len, 0));
        assert!(
            matches!(result, Err(DeviceError::Misaligned { .. })),
            "{offset} {len}"
        );
    }
    let result = device.read_at(MIB, &mut AlignedBuf::zeroed(4096));
    assert!(matches!(result, Err(DeviceError::OutOfRange { .. })));
    let result = device.write_at(u64::MAX - 4095, &buf);
    assert!(matches!(result, Err(DeviceError::OutOfRange { .. })));
    assert!(matches!(
        device.discard(0, 100),
        Err(DeviceError::Misaligned { .. })
    ));
}

// Checks that a 512-byte sector size is accepted for images and allows 512-byte transfers.
#[test]
fn sector_size_512_image() {
    let dir = temp_dir();
    let options = OpenOptions::new().sector_size(512).create_size(MIB);
    let device = FileDevice::open(dir.path().join("image"), &options).unwrap();
    assert_eq!(device.logical_sector_size(), 512);
    assert_eq!(device.physical_sector_size(), 4096);
    device.write_at(512, &filled(512, 9)).unwrap();
    assert_eq!(read(&device, 512, 512), filled(512, 9));
}

// Checks bad sector and create sizes are refused with `Geometry` before anything is created.
#[test]
fn bad_geometry_options_are_refused() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    for options in [
        OpenOptions::new().sector_size(1000).create_size(MIB),
        OpenOptions::new().sector_size(8192).create_size(MIB),
        OpenOptions::new().create_size(MIB + 512),
    ] {
        let result = FileDevice::open(&path, &options);
        assert!(
            matches!(result, Err(DeviceError::Geometry { .. })),
            "{options:?}"
        );
    }
    assert!(!path.exists());
}

// Checks read-only opens: writes and discards refused, readers share, a writer is refused.
#[test]
fn read_only_refuses_writes() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    drop(create(&path, MIB));
    let read_only = OpenOptions::new().read_only(true);
    let device = FileDevice::open(&path, &read_only).unwrap();
    assert!(device.read_only());
    let result = device.write_at(0, &filled(4096, 1));
    assert!(matches!(result, Err(DeviceError::ReadOnly { op: "write" })));
    assert!(matches!(
        device.discard(0, 4096),
        Err(DeviceError::ReadOnly { .. })
    ));
    assert!(device.flush().is_ok());
    let second_reader = FileDevice::open(&path, &read_only).unwrap();
    assert_eq!(read(&second_reader, 0, 4096), AlignedBuf::zeroed(4096));
    let writer = FileDevice::open(&path, &OpenOptions::new());
    assert!(matches!(writer, Err(DeviceError::Busy { .. })));
}

// Checks that a 1 TiB image is created sparse: right size, almost no blocks, usable at the end.
#[test]
fn sparse_one_tebibyte_image() {
    let dir = temp_dir();
    let path = dir.path().join("huge");
    let tebibyte = 1u64 << 40;
    let device = create(&path, tebibyte);
    assert_eq!(device.size_bytes(), tebibyte);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), tebibyte);
    assert!(
        meta.blocks() < 64,
        "image is not sparse: {} blocks",
        meta.blocks()
    );
    device.write_at(tebibyte - 4096, &filled(4096, 3)).unwrap();
    assert_eq!(read(&device, tebibyte - 4096, 4096), filled(4096, 3));
}

// Checks that a second open in the same process is refused, and allowed after the first drops.
#[test]
fn second_open_in_same_process_is_busy() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    let first = create(&path, MIB);
    let error = FileDevice::open(&path, &OpenOptions::new()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, DeviceError::Busy { .. }), "{error:?}");
    assert!(
        message.contains("already open in this process"),
        "{message}"
    );
    // The refused open must not have dropped the first open's lock (see `claim`).
    first.write_at(0, &filled(4096, 1)).unwrap();
    drop(first);
    let again = FileDevice::open(&path, &OpenOptions::new()).unwrap();
    assert_eq!(read(&again, 0, 4096), filled(4096, 1));
}

/// Kills and reaps a child process we started, on every exit path.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PYTHON_LOCKER: &str = "import fcntl, sys, time\n\
    f = open(sys.argv[1], 'r+')\n\
    fcntl.lockf(f, fcntl.LOCK_EX)\n\
    print('locked', flush=True)\n\
    time.sleep(60)\n";

// Checks that an fcntl lock held by another process gives `Busy` naming that process's pid.
#[test]
fn lock_held_by_other_process_names_its_pid() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    drop(create(&path, MIB));
    let spawned = Command::new("python3")
        .args(["-c", PYTHON_LOCKER])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn();
    let Ok(child) = spawned else {
        println!("skipped: python3 is not available to hold a lock from another process");
        return;
    };
    let mut guard = ChildGuard(child);
    let pid = guard.0.id();
    let mut line = String::new();
    let stdout = guard.0.stdout.take().unwrap();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let error = FileDevice::open(&path, &OpenOptions::new()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, DeviceError::Busy { .. }), "{error:?}");
    assert!(
        message.contains(&format!("locked by pid {pid} (")),
        "{message}"
    );
    let read_only = FileDevice::open(&path, &OpenOptions::new().read_only(true));
    assert!(matches!(read_only, Err(DeviceError::Busy { .. })));
}

// Checks that a filesystem refusing O_DIRECT (procfs always does) gives `DirectIoUnsupported`
// whose message points to the buffered option.
#[test]
fn direct_io_refusal_is_reported() {
    let options = OpenOptions::new().read_only(true);
    let error = FileDevice::open("/proc/version", &options).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, DeviceError::DirectIoUnsupported { .. }),
        "{error:?}"
    );
    assert!(message.contains("buffered"), "{message}");
}

fn shm_dir() -> Option<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("cairn-blockdev-")
        .tempdir_in("/dev/shm")
        .ok()
}

// Checks tmpfs: O_DIRECT is refused with `DirectIoUnsupported` on kernels before 6.6 (newer
// ones support it, which is also accepted), and buffered mode always works there.
#[test]
fn tmpfs_direct_refused_or_supported_buffered_works() {
    let Some(dir) = shm_dir() else {
        println!("skipped: /dev/shm is not available");
        return;
    };
    let path = dir.path().join("image");
    match FileDevice::open(&path, &OpenOptions::new().create_size(MIB)) {
        Err(DeviceError::DirectIoUnsupported { path: reported }) => {
            assert_eq!(reported, path);
            let message = DeviceError::DirectIoUnsupported { path: reported }.to_string();
            assert!(message.contains("buffered"), "{message}");
        }
        Ok(device) => {
            println!("note: this kernel's tmpfs supports O_DIRECT; refusal not exercised");
            drop(device);
        }
        Err(other) => panic!("unexpected error on tmpfs: {other:?}"),
    }
    let options = OpenOptions::new().buffered().create_size(MIB);
    let device = FileDevice::open(&path, &options).unwrap();
    assert!(!device.direct());
    device.write_at(8192, &filled(4096, 5)).unwrap();
    device.flush().unwrap();
    assert_eq!(read(&device, 8192, 4096), filled(4096, 5));
}

// Checks that discard punches a hole: reads give zeros and the file loses those blocks.
#[test]
fn discard_punches_hole() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    let device = create(&path, 4 * MIB);
    let data = filled(MIB as usize, 7);
    device.write_at(MIB, &data).unwrap();
    device.flush().unwrap();
    let blocks_before = std::fs::metadata(&path).unwrap().blocks();
    assert!(device.discard(MIB, MIB).unwrap());
    assert!(device.discard(0, 0).unwrap());
    assert_eq!(
        read(&device, MIB, MIB as usize),
        AlignedBuf::zeroed(MIB as usize)
    );
    let blocks_after = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks_after < blocks_before,
        "{blocks_before} -> {blocks_after}"
    );
    assert_eq!(device.size_bytes(), 4 * MIB);
}

// Checks that write_zeroes on an image reads back zeros around untouched data and keeps the
// image sparse (no zeros are written).
#[test]
fn write_zeroes_keeps_image_sparse() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    let device = create(&path, 64 * MIB);
    device.write_at(0, &filled(3 * MIB as usize, 9)).unwrap();
    let blocks_before = std::fs::metadata(&path).unwrap().blocks();
    device.write_zeroes(MIB, 63 * MIB).unwrap();
    assert_eq!(
        read(&device, 0, MIB as usize)[..],
        filled(3 * MIB as usize, 9)[..MIB as usize]
    );
    assert_eq!(
        read(&device, MIB, 2 * MIB as usize),
        AlignedBuf::zeroed(2 * MIB as usize)
    );
    let blocks_after = std::fs::metadata(&path).unwrap().blocks();
    assert!(
        blocks_after < blocks_before,
        "{blocks_before} -> {blocks_after}"
    );
    assert!(device.write_zeroes(100, 4096).is_err());
}

// Checks the refusals for things that are not devices and for a missing file.
#[test]
fn not_a_device_and_missing_file() {
    let dir = temp_dir();
    let directory = FileDevice::open(dir.path(), &OpenOptions::new());
    assert!(matches!(directory, Err(DeviceError::NotADevice { .. })));
    let char_device = FileDevice::open("/dev/null", &OpenOptions::new());
    assert!(matches!(char_device, Err(DeviceError::NotADevice { .. })));
    let missing: PathBuf = dir.path().join("missing");
    match FileDevice::open(&missing, &OpenOptions::new()) {
        Err(DeviceError::Open { path, source }) => {
            assert_eq!(path, missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Open error, got {other:?}"),
    }
    // A read-only open never creates, even with a create size.
    let options = OpenOptions::new().read_only(true).create_size(MIB);
    assert!(matches!(
        FileDevice::open(&missing, &options),
        Err(DeviceError::Open { .. })
    ));
}

// Checks that an image whose length is not a whole number of sectors exposes whole sectors only.
#[test]
fn trailing_partial_sector_is_not_exposed() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    std::fs::write(&path, vec![1u8; 4096 * 3 + 100]).unwrap();
    let device = FileDevice::open(&path, &OpenOptions::new()).unwrap();
    assert_eq!(device.size_bytes(), 4096 * 3);
    assert_eq!(
        read(&device, 8192, 4096),
        AlignedBuf::from_slice(&[1u8; 4096])
    );
}

// Checks positional I/O from several threads on disjoint blocks of one shared device.
#[test]
fn concurrent_positional_io() {
    let dir = temp_dir();
    let device = Arc::new(create(&dir.path().join("image"), MIB));
    let threads: Vec<_> = (0..4u8)
        .map(|thread| {
            let device = Arc::clone(&device);
            std::thread::spawn(move || {
                for round in 0..8u64 {
                    let offset = (u64::from(thread) * 8 + round) * 4096;
                    device.write_at(offset, &filled(4096, thread)).unwrap();
                    assert_eq!(read(&*device, offset, 4096), filled(4096, thread));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    device.flush().unwrap();
}

// A batch of writes lands whole: more writes than the ring holds at once, slices of one
// aligned buffer and unaligned ones, on the file device (io_uring) and the memory device
// (one at a time) alike, and concurrent batches from several threads.
#[test]
fn write_batch_lands_every_write() {
    let dir = temp_dir();
    let file = create(&dir.path().join("image"), 4 * MIB);
    let mem = cairn_blockdev::MemDevice::new(4 * MIB, 4096);
    let devices: [&dyn BlockDevice; 2] = [&file, &mem];
    for device in devices {
        let data = filled(200 * 4096 + 1, 3);
        // Scattered backwards over the first 400 blocks; the last write is unaligned.
        let mut batch: Vec<(u64, &[u8])> = (0..199)
            .map(|i| ((398 - 2 * i as u64) * 4096, &data[i * 4096..(i + 1) * 4096]))
            .collect();
        batch.push((4096, &data[199 * 4096 + 1..]));
        device.write_batch(&batch).unwrap();
        for &(offset, bytes) in &batch {
            assert_eq!(&read(device, offset, 4096)[..], bytes, "offset {offset}");
        }
    }
    let file = Arc::new(file);
    let threads: Vec<_> = (0..4u64)
        .map(|lane| {
            let file = Arc::clone(&file);
            std::thread::spawn(move || {
                let data = filled(64 * 4096, lane as u8);
                let base = (512 + lane * 64) * 4096;
                let batch: Vec<(u64, &[u8])> = data
                    .chunks(4096)
                    .enumerate()
                    .map(|(i, block)| (base + i as u64 * 4096, block))
                    .collect();
                file.write_batch(&batch).unwrap();
                assert_eq!(read(file.as_ref(), base, 64 * 4096), data);
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

// A batch with a misaligned or out-of-range entry is refused before anything is written;
// a read-only device refuses the batch.
#[test]
fn write_batch_checks_every_entry_first() {
    let dir = temp_dir();
    let path = dir.path().join("image");
    let device = create(&path, MIB);
    let data = filled(8192, 5);
    let misaligned: [(u64, &[u8]); 2] = [(0, &data[..4096]), (100, &data[4096..])];
    assert!(matches!(
        device.write_batch(&misaligned),
        Err(DeviceError::Misaligned { .. })
    ));
    let past_end: [(u64, &[u8]); 2] = [(0, &data[..4096]), (MIB, &data[4096..])];
    assert!(matches!(
        device.write_batch(&past_end),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert_eq!(read(&device, 0, 4096), AlignedBuf::zeroed(4096));
    drop(device);
    let read_only = FileDevice::open(&path, &OpenOptions::new().read_only(true)).unwrap();
    assert!(matches!(
        read_only.write_batch(&[(0, &data[..4096])]),
        Err(DeviceError::ReadOnly { op: "write" })
    ));
}

// `read_async`: many reads of several parts each, handed over at once from several threads,
// all land (through the completion thread) with the bytes written; a part with unaligned
// memory is read synchronously, one past the end fails the read and only it; reads still in
// flight when the device drops finish first.
#[test]
fn reads_handed_over_all_land() {
    use cairn_blockdev::ReadJob;
    use std::sync::mpsc;

    let dir = temp_dir();
    let file = Arc::new(create(&dir.path().join("image"), 8 * MIB));
    let data = filled(8 * MIB as usize, 3);
    file.write_from(0, &data).unwrap();
    let (sender, receiver) = mpsc::channel();
    let jobs_per_thread = 200;
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let (file, sender) = (Arc::clone(&file), sender.clone());
            scope.spawn(move || {
                for job in 0..jobs_per_thread {
                    let at = (thread * 977 + job * 131) % 1800 * 4096;
                    let parts = vec![
                        (at + 8192, 0..4096),
                        (at, 4096..12288),
                        (at + 65536, 12288..16384),
                    ];
                    let sender = sender.clone();
                    let job = ReadJob {
                        buf: AlignedBuf::zeroed(16384),
                        parts,
                    };
                    file.read_async(
                        job,
                        Box::new(move |buf, outcome| {
                            sender.send((at, buf, outcome.is_ok())).unwrap();
                        }),
                    );
                }
            });
        }
    });
    for _ in 0..4 * jobs_per_thread {
        let (at, buf, ok) = receiver
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap();
        let at = at as usize;
        assert!(ok);
        assert_eq!(&buf[..4096], &data[at + 8192..at + 12288]);
        assert_eq!(&buf[4096..12288], &data[at..at + 8192]);
        assert_eq!(&buf[12288..], &data[at + 65536..at + 69632]);
    }
    // Unaligned memory (a part starting 512 bytes into the buffer): read all the same.
    let odd = ReadJob {
        buf: AlignedBuf::zeroed(8192),
        parts: vec![(4096, 512..4608)],
    };
    let (sender, receiver) = mpsc::channel();
    let unaligned = sender.clone();
    file.read_async(
        odd,
        Box::new(move |buf, outcome| unaligned.send((buf, outcome.is_ok())).unwrap()),
    );
    let (buf, ok) = receiver.recv().unwrap();
    assert!(ok);
    assert_eq!(&buf[512..4608], &data[4096..8192]);
    let past = ReadJob {
        buf: AlignedBuf::zeroed(4096),
        parts: vec![(8 * MIB, 0..4096)],
    };
    let failing = sender.clone();
    file.read_async(
        past,
        Box::new(move |buf, outcome| failing.send((buf, outcome.is_ok())).unwrap()),
    );
    assert!(!receiver.recv().unwrap().1, "a read past the end succeeded");
    // Handed over, then the device goes: the read still lands before the drop returns.
    let last = ReadJob {
        buf: AlignedBuf::zeroed(1 << 20),
        parts: vec![(MIB, 0..1 << 20)],
    };
    file.read_async(
        last,
        Box::new(move |buf, outcome| sender.send((buf, outcome.is_ok())).unwrap()),
    );
    drop(Arc::into_inner(file).unwrap());
    let (buf, ok) = receiver.try_recv().unwrap();
    assert!(ok);
    assert_eq!(&buf[..], &data[MIB as usize..2 * MIB as usize]);
}
