#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Concurrency: threads mixing every namespace and data operation (copy_file_range, which
//! shares blocks, included) with the forgets the kernel
//! sends at any time, under the lock-order checker (debug builds: a violation panics) and
//! parking_lot's cycle detector, with a watchdog that fails the run when no operation
//! finishes for 30 s or a lock cycle appears. Afterwards every reference is dropped, the
//! filesystem unmounts and fsck finds it clean.
//!
//! `CAIRN_STRESS_SECS` (default 4) sets how long the mix runs, `CAIRN_STRESS_THREADS`
//! (default 8) how many threads, `CAIRN_STRESS_SEED` the seed (printed on every run).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_fs::{
    Credentials, FileKind, Filesystem, FsError, MountOptions, RenameMode, SetAttr, XattrFlags,
};
use common::{fsck_clean, make_device, mount, mount_with, root, write_behind};

/// No operation finishing for this long is a hang.
const HANG_LIMIT: Duration = Duration::from_secs(30);
/// Names in each directory: few, so threads collide on them.
const NAMES: u64 = 12;
/// Directories every thread works in.
const SHARED_DIRS: u64 = 4;

/// Fails the process when no operation finishes for `HANG_LIMIT` or a lock cycle appears,
/// printing what the detector knows: a hang must not pass as a slow test.
struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn start(progress: Arc<AtomicU64>) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut last = (progress.load(Ordering::Relaxed), Instant::now());
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let cycles = cairn_lockrank::lock_cycles();
                let now = progress.load(Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                }
                let stuck = last.1.elapsed() >= HANG_LIMIT;
                if cycles.is_empty() && !stuck {
                    continue;
                }
                let mut report = if stuck {
                    format!("HANG: no operation finished for {:?}\n", last.1.elapsed())
                } else {
                    "HANG: a lock cycle\n".to_string()
                };
                for cycle in cycles {
                    report.push_str(&format!("{cycle}\n"));
                }
                to_stderr(&report);
                print_stacks();
                std::process::abort();
            }
        });
        Watchdog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Straight to the process's stderr: the test harness captures `eprintln!` and would lose
/// the report when the watchdog aborts.
fn to_stderr(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Every thread's stack, through gdb where it is installed (a hang's evidence). gdb writes
/// to this process's stderr itself: while attached it stops every thread here, so a pipe
/// back to this process would fill and leave both waiting for good.
fn print_stacks() {
    let pid = std::process::id().to_string();
    let stacks = std::process::Command::new("timeout")
        .args([
            "-k",
            "5",
            "120",
            "gdb",
            "-p",
            &pid,
            "-batch",
            "-ex",
            "thread apply all bt 30",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::io::stderr())
        .stderr(std::io::stderr())
        .status();
    if let Err(error) = stacks {
        to_stderr(&format!("no stacks (gdb: {error})\n"));
    }
}

/// xorshift64*: a seeded sequence, so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Operations that succeeded, by kind (printed, so a run shows what it exercised).
static SUCCEEDED: [AtomicU64; KINDS.len()] = [const { AtomicU64::new(0) }; KINDS.len()];
const KINDS: [&str; 15] = [
    "create", "lookup", "mkdir", "unlink", "rmdir", "rename", "link", "write", "truncate",
    "setxattr", "fsync", "open", "read", "readdir", "clone",
];

thread_local! {
    /// The filesystem this thread's operations run on, for judging a `NoSpace`.
    static WORKING_ON: std::cell::RefCell<Option<Arc<Filesystem>>> =
        const { std::cell::RefCell::new(None) };
}

/// A `NoSpace` is expected only when the filesystem is nearly full (less than an eighth of
/// its blocks free: large writes and preallocation of many files can fill it in a long
/// run); with more free it is a bug, and the free count is in the failure.
fn check_no_space(what: &str) {
    WORKING_ON.with_borrow(|fs| {
        let fs = fs.as_ref().expect("the worker set its filesystem");
        let stat = fs.statfs().expect("statfs");
        assert!(
            stat.blocks_free * 8 < stat.blocks,
            "{what}: NoSpace with {} of {} blocks free\nallocator: {:?}\ndata: {:?}",
            stat.blocks_free,
            stat.blocks,
            fs.stats().alloc,
            fs.stats().data
        );
    });
}

/// Errors a racing operation may meet; anything else (corruption, I/O, shutdown) fails.
fn expected(result: Result<(), FsError>, what: &str) {
    if result.is_ok()
        && let Some(kind) = KINDS.iter().position(|k| *k == what)
    {
        SUCCEEDED[kind].fetch_add(1, Ordering::Relaxed);
    }
    match result {
        Ok(())
        | Err(FsError::NotFound)
        | Err(FsError::Exists)
        | Err(FsError::NotEmpty)
        | Err(FsError::NotDirectory)
        | Err(FsError::IsDirectory)
        | Err(FsError::NotPermitted)
        | Err(FsError::InvalidArgument(_))
        | Err(FsError::TooManyLinks)
        | Err(FsError::NoData) => {}
        Err(FsError::NoSpace) => check_no_space(what),
        Err(error) => panic!("{what}: unexpected {error:?}"),
    }
}

/// One thread's view: the directories it may use and the inodes it holds references on.
struct Worker {
    fs: Arc<Filesystem>,
    rng: Rng,
    dirs: Vec<u64>,
    held: Vec<(u64, FileKind)>,
    who: Credentials,
}

impl Worker {
    fn name(&mut self) -> Vec<u8> {
        format!("n{}", self.rng.below(NAMES)).into_bytes()
    }

    /// A directory: a shared or own one, or one this thread holds (a subdirectory).
    fn dir(&mut self) -> u64 {
        let held_dirs: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, kind)| *kind == FileKind::Directory)
            .map(|(inode, _)| *inode)
            .collect();
        if !held_dirs.is_empty() && self.rng.below(4) == 0 {
            return held_dirs[self.rng.below(held_dirs.len() as u64) as usize];
        }
        self.dirs[self.rng.below(self.dirs.len() as u64) as usize]
    }

    fn file(&mut self) -> Option<u64> {
        let files: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, kind)| *kind == FileKind::Regular)
            .map(|(inode, _)| *inode)
            .collect();
        (!files.is_empty()).then(|| files[self.rng.below(files.len() as u64) as usize])
    }

    fn hold(&mut self, result: Result<cairn_fs::Attr, FsError>, what: &str) {
        match result {
            Ok(attr) => {
                self.held.push((attr.inode, attr.kind));
                expected(Ok(()), what);
            }
            Err(error) => expected(Err(error), what),
        }
    }

    fn forget_some(&mut self) {
        for _ in 0..=self.rng.below(3) {
            if self.held.is_empty() {
                return;
            }
            let index = self.rng.below(self.held.len() as u64) as usize;
            let (inode, _) = self.held.swap_remove(index);
            self.fs.forget(inode, 1);
        }
    }

    fn step(&mut self) {
        let fs = Arc::clone(&self.fs);
        let who = self.who.clone();
        match self.rng.below(19) {
            0 | 1 => {
                let (dir, name) = (self.dir(), self.name());
                let made = fs.create(dir, &name, FileKind::Regular, 0o644, 0, &who);
                self.hold(made, "create");
            }
            2 => {
                let (dir, name) = (self.dir(), self.name());
                self.hold(fs.lookup(dir, &name), "lookup");
            }
            3 => {
                let (dir, name) = (self.dir(), self.name());
                self.hold(fs.mkdir(dir, &name, 0o755, &who), "mkdir");
            }
            4 | 5 => {
                let (dir, name) = (self.dir(), self.name());
                expected(fs.unlink(dir, &name, &who), "unlink");
            }
            6 => {
                let (dir, name) = (self.dir(), self.name());
                expected(fs.rmdir(dir, &name, &who), "rmdir");
            }
            7 | 8 => self.rename(),
            9 => {
                let Some(file) = self.file() else { return };
                let (dir, name) = (self.dir(), self.name());
                self.hold(fs.link(file, dir, &name, &who), "link");
            }
            10 => self.write(),
            11 => {
                let Some(file) = self.file() else { return };
                let size = self.rng.below(3 * 65536);
                let changes = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                expected(fs.setattr(file, &changes, &who).map(|_| ()), "truncate");
            }
            12 => {
                let Some(file) = self.file() else { return };
                let name = format!("user.a{}", self.rng.below(4));
                let value = vec![b'v'; self.rng.below(200) as usize];
                let set = fs.setxattr(file, name.as_bytes(), &value, XattrFlags::Any, &who);
                expected(set, "setxattr");
            }
            13 => {
                let Some(file) = self.file() else { return };
                expected(fs.fsync(file, self.rng.below(2) == 0), "fsync");
            }
            14 => {
                let Some(file) = self.file() else { return };
                let offset = self.rng.below(250_000);
                let read = fs.read(file, offset, 1 + self.rng.below(65536) as u32);
                expected(read.map(|_| ()), "read");
            }
            15 => {
                let dir = self.dir();
                expected(fs.readdir(dir, 0, 1000).map(|_| ()), "readdir");
            }
            16 => self.clone_range(),
            _ => self.forget_some(),
        }
    }

    fn rename(&mut self) {
        let (from, name) = (self.dir(), self.name());
        let (to, new_name) = (self.dir(), self.name());
        let mode = match self.rng.below(6) {
            0 => RenameMode::NoReplace,
            1 => RenameMode::Exchange,
            _ => RenameMode::Replace,
        };
        let result = self.fs.rename(from, &name, to, &new_name, mode, &self.who);
        expected(result, "rename");
    }

    /// copy_file_range between two files this thread holds (maybe one file: ranges that
    /// overlap are refused), block-aligned offsets mostly (shared blocks, copy-on-write by
    /// every later write), sometimes not (a byte copy); both files' I/O locks at once.
    fn clone_range(&mut self) {
        let (Some(from), Some(to)) = (self.file(), self.file()) else {
            return;
        };
        let misalign = match self.rng.below(4) {
            0 => self.rng.below(4096),
            _ => 0,
        };
        let src_offset = self.rng.below(48) * 4096 + misalign;
        let dst_offset = self.rng.below(48) * 4096 + misalign;
        let len = 1 + self.rng.below(100_000);
        let copied = self
            .fs
            .copy_file_range(from, src_offset, to, dst_offset, len);
        expected(copied.map(|_| ()), "clone");
    }

    fn write(&mut self) {
        let Some(file) = self.file() else { return };
        let open = match self.fs.open(file, true, false, false, &self.who) {
            Ok(open) => {
                expected(Ok(()), "open");
                open
            }
            Err(error) => return expected(Err(error), "open"),
        };
        let offset = self.rng.below(200_000);
        let bytes = vec![b'd'; 1 + self.rng.below(40_000) as usize];
        expected(self.fs.write(file, offset, &bytes).map(|_| ()), "write");
        expected(self.fs.release(open), "release");
    }
}

/// Runs `threads` workers for `secs` seconds over a fresh filesystem mounted with
/// `options`; fsck after. A further thread runs the background passes (writeback, the
/// inode reclaim passes requests hand over) the daemon's thread would.
fn stress(threads: u64, secs: u64, seed: u64, options: MountOptions) {
    eprintln!("stress: {threads} threads, {secs} s, CAIRN_STRESS_SEED={seed}");
    let device = make_device(512 << 20);
    let fs = Arc::new(mount_with(&device, options));
    let shared: Vec<u64> = (0..SHARED_DIRS)
        .map(|i| {
            let name = format!("s{i}");
            fs.mkdir(fs.root(), name.as_bytes(), 0o777, &root())
                .expect("shared directory")
                .inode
        })
        .collect();
    let progress = Arc::new(AtomicU64::new(0));
    let watchdog = Watchdog::start(Arc::clone(&progress));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let background = {
        let fs = Arc::clone(&fs);
        let signal = fs.attach_background();
        std::thread::spawn(move || {
            while Instant::now() < deadline {
                signal.wait(Duration::from_millis(20));
                fs.background_pass();
            }
            fs.detach_background();
        })
    };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let fs = Arc::clone(&fs);
            let progress = Arc::clone(&progress);
            let own = fs
                .mkdir(fs.root(), format!("t{t}").as_bytes(), 0o777, &root())
                .expect("own directory")
                .inode;
            let mut dirs = shared.clone();
            dirs.push(own);
            std::thread::spawn(move || {
                let rng = Rng(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let who = root();
                WORKING_ON.set(Some(Arc::clone(&fs)));
                let mut worker = Worker {
                    fs,
                    rng,
                    dirs,
                    held: Vec::new(),
                    who,
                };
                let ops_max = env_or("CAIRN_STRESS_OPS", u64::MAX);
                let mut ops = 0;
                while Instant::now() < deadline && ops < ops_max {
                    ops += 1;
                    worker.step();
                    progress.fetch_add(1, Ordering::Relaxed);
                }
                for (inode, _) in worker.held.drain(..) {
                    worker.fs.forget(inode, 1);
                }
            })
        })
        .collect();
    for handle in handles.into_iter().chain([background]) {
        handle.join().expect("a worker panicked");
    }
    let counts: Vec<String> = KINDS
        .iter()
        .zip(&SUCCEEDED)
        .map(|(kind, count)| format!("{kind} {}", count.load(Ordering::Relaxed)))
        .collect();
    eprintln!(
        "stress: {} operations; succeeded: {}",
        progress.load(Ordering::Relaxed),
        counts.join(", ")
    );
    unmount_and_check(fs, &device, &progress);
    drop(watchdog);
}

/// Unmounts and runs fsck while the watchdog still watches: an unmount that waits forever
/// (for log space, for a buffer) is a hang too. Each phase counts as progress.
fn unmount_and_check(
    fs: Arc<Filesystem>,
    device: &Arc<cairn_blockdev::MemDevice>,
    progress: &AtomicU64,
) {
    progress.fetch_add(1, Ordering::Relaxed);
    let fs = Arc::into_inner(fs).expect("the only reference");
    fs.unmount().expect("unmount");
    progress.fetch_add(1, Ordering::Relaxed);
    fsck_clean(device);
}

/// `stress` with the thread count, length and seed the environment sets (`CAIRN_STRESS_*`).
fn stress_as_configured(options: MountOptions) {
    let seed = env_or(
        "CAIRN_STRESS_SEED",
        0x5eed_0000_0000_0000 ^ std::process::id() as u64,
    );
    stress(
        env_or("CAIRN_STRESS_THREADS", 8),
        env_or("CAIRN_STRESS_SECS", 4),
        seed,
        options,
    );
}

#[test]
fn many_threads_mixing_every_operation_never_hang() {
    stress_as_configured(MountOptions::default());
}

/// The same mix with write-behind on and a small cap (1 MiB), so writers, fsync, the
/// background pass and every operation that writes an inode's pages back meet.
#[test]
fn many_threads_with_write_behind_never_hang() {
    stress_as_configured(write_behind(1 << 20));
}

/// Issue 16: two forgets freeing unlinked inodes of one AGI bucket deadlocked (one held the
/// AGI and waited for the other's inode lock while walking the bucket). Four threads create,
/// unlink and forget 100 files each, 200 rounds; it hung within seconds before the fix.
#[test]
fn regression_concurrent_forgets_of_unlinked_inodes() {
    let device = make_device(256 << 20);
    let fs = Arc::new(mount(&device));
    let dir = fs
        .mkdir(fs.root(), b"d", 0o755, &root())
        .expect("mkdir")
        .inode;
    let progress = Arc::new(AtomicU64::new(0));
    let watchdog = Watchdog::start(Arc::clone(&progress));
    for round in 0..200 {
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let fs = Arc::clone(&fs);
                let progress = Arc::clone(&progress);
                std::thread::spawn(move || {
                    let names: Vec<String> =
                        (0..100).map(|i| format!("f{round}-{t}-{i}")).collect();
                    let inodes: Vec<u64> = names
                        .iter()
                        .map(|name| {
                            fs.create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &root())
                                .expect("create")
                                .inode
                        })
                        .collect();
                    for name in &names {
                        fs.unlink(dir, name.as_bytes(), &root()).expect("unlink");
                    }
                    for inode in inodes {
                        fs.forget(inode, 1);
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("a thread panicked");
        }
    }
    unmount_and_check(fs, &device, &progress);
    drop(watchdog);
}
