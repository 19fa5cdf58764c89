#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Concurrency through the real kernel FUSE: processes creating, linking, unlinking,
//! renaming (within and across shared directories), making and removing directories,
//! writing, truncating, setting attributes and syncing, while the kernel is made to forget
//! inodes all the time (`drop_caches` every 200 ms, 50 ms attribute and entry timeouts).
//! A process whose last operation finished more than 30 s ago is reported (the stall's
//! length, the daemon's `cairn stats` with its oldest request in flight, and every daemon
//! thread's kernel stack); one stuck for `CAIRN_MOUNT_STRESS_HANG_SECS` (default 120) fails
//! the run with the same report. The two limits tell a hang from a daemon starved of CPU or
//! disk on a loaded machine, which resumes. Afterwards the image unmounts and
//! `fsck.cairn -n` finds it clean.
//!
//! `CAIRN_MOUNT_STRESS_SECS` (default 15) and `CAIRN_MOUNT_STRESS_PROCS` (default 8) set the
//! length and the number of processes: the long runs of docs/reliability.md use 1800 s with
//! 8 and with 32.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::{Mount, Scratch, cairn_bin, fsck, python};

/// An operation that has not finished after this long is a hang.
/// A worker this long without finishing an operation is reported (and the run goes on).
const STALL_REPORT: Duration = Duration::from_secs(30);

/// One worker: random operations on a few names in shared directories and its own, until
/// the deadline; writes the time of its last finished operation to its heartbeat file. An
/// errno a race explains is fine; any other (EIO, EUCLEAN...) ends it with status 1.
const WORKER: &str = r#"
import errno, os, random, sys, time
root, me, seconds, heartbeat = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rng = random.Random(int(sys.argv[5]) * 1000 + me)
dirs = [os.path.join(root, "s%d" % i) for i in range(4)] + [os.path.join(root, "p%d" % me)]
ok = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR,
      errno.EINVAL, errno.EMLINK, errno.ENODATA, errno.EPERM}
def name():
    d = rng.choice(dirs)
    sub = os.path.join(d, "d%d" % rng.randrange(3))
    return os.path.join(sub if rng.random() < 0.2 else d, "n%d" % rng.randrange(10))
def create(p):
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
def write(p):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.pwrite(fd, b"x" * rng.randrange(1, 40000), rng.randrange(0, 200000))
        if rng.random() < 0.3:
            os.fsync(fd)
    finally:
        os.close(fd)
def sync(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
def mkdir(p):
    os.mkdir(os.path.join(os.path.dirname(p), "d%d" % rng.randrange(3)))
def rmdir(p):
    os.rmdir(os.path.join(os.path.dirname(p), "d%d" % rng.randrange(3)))
ops = [create, create, os.unlink, write, lambda p: os.truncate(p, rng.randrange(0, 100000)),
       lambda p: os.link(p, name()), lambda p: os.rename(p, name()), mkdir, rmdir,
       lambda p: os.setxattr(p, "user.a%d" % rng.randrange(3), b"v" * rng.randrange(300)),
       sync, lambda p: os.stat(p), lambda p: os.listdir(os.path.dirname(p))]
end, count, beat = time.time() + seconds, 0, 0.0
while time.time() < end:
    op = rng.choice(ops)
    try:
        op(name())
    except OSError as e:
        if e.errno not in ok:
            print("worker %d: %s: %s" % (me, getattr(op, "__name__", "op"), e), flush=True)
            sys.exit(1)
    count += 1
    if time.time() - beat > 0.5:
        beat = time.time()
        with open(heartbeat + ".new", "w") as f:
            f.write("%f %d" % (beat, count))
        os.replace(heartbeat + ".new", heartbeat)
print("worker %d: %d operations" % (me, count), flush=True)
"#;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Drops the kernel's dentry and inode caches every 200 ms until stopped, so forgets reach
/// the daemon for inodes other workers still use.
fn drop_caches_loop(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let _ = std::fs::write("/proc/sys/vm/drop_caches", "2");
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// Seconds since the worker's last heartbeat (since `started` before its first).
fn heartbeat_age(path: &Path, started: Instant) -> Duration {
    let beat = std::fs::read_to_string(path).ok().and_then(|text| {
        let seconds: f64 = text.split(' ').next()?.parse().ok()?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        Some(Duration::from_secs_f64((now - seconds).max(0.0)))
    });
    beat.unwrap_or_else(|| started.elapsed())
}

/// The kernel stacks of every thread of process `pid`, each under its name.
fn kernel_stacks(pid: u32) -> String {
    let mut stacks = String::new();
    let tasks = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
        let read = |name| std::fs::read_to_string(task.path().join(name)).unwrap_or_default();
        stacks.push_str(&format!("-- {}{}", read("comm"), read("stack")));
    }
    stacks
}

/// What a hang looks like from outside: the daemon's statistics, its threads' stacks and
/// the stuck worker's.
fn hang_report(mount: &Mount, worker: u32) -> String {
    let stats = Command::new("timeout")
        .args(["5", cairn_bin().to_str().unwrap(), "stats"])
        .arg(&mount.mountpoint)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    format!(
        "cairn stats:\n{stats}\ndaemon threads:\n{}\nthe stuck worker:\n{}",
        kernel_stacks(mount.pid),
        kernel_stacks(worker)
    )
}

/// Waits for every worker, reporting stalls and failing on a hang or a failed worker.
fn watch(mount: &Mount, workers: &mut [(Child, std::path::PathBuf)], started: Instant) {
    let hang_limit = Duration::from_secs(env_or("CAIRN_MOUNT_STRESS_HANG_SECS", 120));
    let mut stalled = vec![false; workers.len()];
    loop {
        let mut running = 0;
        for ((worker, heartbeat), stalled) in workers.iter_mut().zip(&mut stalled) {
            if let Some(status) = worker.try_wait().unwrap() {
                assert!(status.success(), "a worker failed: {status}");
                continue;
            }
            running += 1;
            let age = heartbeat_age(heartbeat, started);
            if age > hang_limit {
                panic!(
                    "HANG: a worker's last operation finished {age:?} ago\n{}",
                    hang_report(mount, worker.id())
                );
            }
            if age > STALL_REPORT && !*stalled {
                eprintln!(
                    "STALL (at {:?}): a worker's last operation finished {age:?} ago\n{}",
                    started.elapsed(),
                    hang_report(mount, worker.id())
                );
            }
            *stalled = age > STALL_REPORT;
        }
        if running == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn processes_mixing_every_operation_never_hang() {
    let seconds = env_or("CAIRN_MOUNT_STRESS_SECS", 15);
    let processes = env_or("CAIRN_MOUNT_STRESS_PROCS", 8);
    let scratch = Scratch::new();
    let image = scratch.format("2G");
    let mnt = scratch.mountpoint();
    let log = scratch.dir.path().join("daemon.log");
    let options = format!(
        "attr_timeout=0.05,entry_timeout=0.05,logfile={}",
        log.display()
    );
    let mount = Mount::new(&image, &mnt, &options);
    for dir in (0..4).map(|i| format!("s{i}")) {
        std::fs::create_dir(mount.path(&dir)).unwrap();
    }
    let seed = std::process::id();
    eprintln!("mount stress: {processes} processes, {seconds} s, seed {seed}");
    let stop = Arc::new(AtomicBool::new(false));
    let dropper = drop_caches_loop(Arc::clone(&stop));
    let started = Instant::now();
    let mut workers: Vec<_> = (0..processes)
        .map(|me| {
            std::fs::create_dir(mount.path(&format!("p{me}"))).unwrap();
            let heartbeat = scratch.dir.path().join(format!("heartbeat-{me}"));
            let child = Command::new(python())
                .args(["-c", WORKER, mnt.to_str().unwrap(), &me.to_string()])
                .arg(seconds.to_string())
                .arg(&heartbeat)
                .arg(seed.to_string())
                .spawn()
                .unwrap();
            (child, heartbeat)
        })
        .collect();
    let watched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        watch(&mount, &mut workers, started)
    }));
    stop.store(true, Ordering::Relaxed);
    dropper.join().unwrap();
    if let Err(panic) = watched {
        // Kill the workers first: the mount's drop then detaches it and kills the daemon.
        for (worker, _) in &mut workers {
            let _ = worker.kill();
        }
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = logged.lines().collect();
        eprintln!(
            "daemon log (last lines):\n{}",
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
        std::panic::resume_unwind(panic);
    }
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after the stress run");
}
