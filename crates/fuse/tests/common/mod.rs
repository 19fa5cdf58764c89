//! Shared helpers for the mount tests: formatted images, mounts that always clean up,
//! finding the daemon, fsck, and running commands.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use clap::Parser;

/// How long a daemon may take to write everything back and exit after an unmount.
const EXIT_WAIT: Duration = Duration::from_secs(120);

/// The fuse module's parameter that lets a connection negotiate FUSE over io_uring.
pub const RING_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// The transport the mount tests run on: `/dev/fuse` (`-o nouring`) unless
/// `CAIRN_TEST_TRANSPORT=uring` (then every mount gets `-o uring`, with the module
/// parameter turned on for its handshake, and must come up on the ring).
pub fn ring_transport() -> bool {
    std::env::var("CAIRN_TEST_TRANSPORT").is_ok_and(|value| value == "uring")
}

/// `options` plus the test transport's option (`uring` or `nouring`).
pub fn transport_options(options: &str) -> String {
    let transport = match ring_transport() {
        true => "uring",
        false => "nouring",
    };
    match options.is_empty() {
        true => transport.to_string(),
        false => format!("{options},{transport}"),
    }
}

/// Why this kernel cannot run the ring tests, if it cannot.
pub fn ring_unavailable() -> Option<String> {
    let exists = Path::new(RING_PARAMETER).exists();
    (!exists).then(|| format!("this kernel has no FUSE over io_uring (no {RING_PARAMETER})"))
}

/// Runs `mount` with the fuse module's `enable_uring` on (when the tests run on the ring),
/// restoring it after: the kernel reads it only during a connection's handshake. Other
/// processes (test binaries running at the same time) wait on a lock file so that the
/// first one's saved value is the one put back.
pub fn with_ring_enabled<T>(mount: impl FnOnce() -> T) -> T {
    if !ring_transport() {
        return mount();
    }
    with_ring_parameter("Y", mount)
}

/// Runs `f` with the `enable_uring` parameter set to `value` ("Y" or "N"), then restores
/// it.
pub fn with_ring_parameter<T>(value: &str, f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsRawFd;
    static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = IN_PROCESS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let lock = std::fs::File::create("/run/cairn-test-enable-uring.lock").unwrap();
    // SAFETY: flock on a descriptor this function owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let saved = std::fs::read_to_string(RING_PARAMETER).unwrap();
    std::fs::write(RING_PARAMETER, value).unwrap();
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(RING_PARAMETER, self.0.trim());
        }
    }
    let restore = Restore(saved);
    let result = f();
    drop(restore);
    result
}

/// The transport `cairn stats` says serves the mount at `mountpoint`.
pub fn served_transport(mountpoint: &Path) -> String {
    let output = run(
        cairn_bin().to_str().unwrap(),
        &["stats", mountpoint.to_str().unwrap()],
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.lines()
        .find_map(|line| line.trim().strip_prefix("transport: "))
        .unwrap_or("unknown")
        .to_string()
}

/// The built `cairn` binary, or `CAIRN_BIN` (long runs use a copy that later builds leave
/// alone).
pub fn cairn_bin() -> PathBuf {
    std::env::var_os("CAIRN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cairn")))
}

/// Runs `program args` and returns its output (a missing program panics with its name).
pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

/// Runs a shell command line; panics with its output unless it succeeds.
pub fn sh(script: &str) -> String {
    let output = Command::new("sh").args(["-ec", script]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "`{script}` failed:\n{text}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether `program` is installed.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A temporary directory holding an image and a mount point.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    /// A scratch directory under the target directory's filesystem (which takes O_DIRECT).
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("cairn-fuse-test")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        Scratch { dir }
    }

    /// Lets every user reach the mount point (permission tests act as other users).
    pub fn share(&self) {
        use std::os::unix::fs::PermissionsExt;
        let open = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(self.dir.path(), open).unwrap();
    }

    pub fn image(&self) -> PathBuf {
        self.dir.path().join("cairn.img")
    }

    pub fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// Formats a sparse image of `size` (e.g. "512M").
    pub fn format(&self, size: &str) -> PathBuf {
        let image = self.image();
        mkfs(&image, &["-s", size]);
        image
    }
}

/// Runs mkfs.cairn in-process on `device` with extra `args`.
pub fn mkfs(device: &Path, args: &[&str]) {
    let mut argv = vec!["mkfs.cairn", "-q"];
    argv.extend_from_slice(args);
    let device = device.to_str().unwrap();
    argv.push(device);
    let parsed = cairn_mkfs::cli::Args::try_parse_from(&argv).unwrap();
    cairn_mkfs::cli::run(&parsed).unwrap_or_else(|e| panic!("mkfs {device}: {e}"));
}

/// Runs fsck.cairn in-process; returns its exit code (0 = clean).
pub fn fsck(device: &Path) -> u8 {
    let device = device.to_str().unwrap();
    let parsed = cairn_fsck::cli::Args::try_parse_from(["fsck.cairn", device]).unwrap();
    cairn_fsck::cli::run(&parsed)
}

/// Pids of processes whose command line mentions `needle`.
pub fn pids_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if pid != me && text.contains("cairn") && text.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let path = path.to_str().unwrap();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(path))
}

/// The options /proc/self/mounts shows for the mount at `path`.
pub fn mount_flags(path: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let path = path.to_str().unwrap();
    mounts
        .lines()
        .filter(|line| line.split(' ').nth(1) == Some(path))
        .filter_map(|line| line.split(' ').nth(3))
        .next_back()
        .map(|options| options.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// Waits for `pid` to exit, every thread of it; returns whether it did in time.
pub fn wait_exit(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie has exited; its stat says state Z. A leader is a zombie as soon as its
        // own thread ends, while other threads may still be exiting (ring workers cancel
        // their io_uring commands first) and hold its descriptors and the image's lock.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z'));
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
        if zombie && threads <= 1 {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A live cairn mount. Dropping it detaches the mount and kills the daemon, so a failing
/// test leaves nothing mounted; `unmount` is the clean path.
pub struct Mount {
    pub mountpoint: PathBuf,
    pub device: PathBuf,
    pub pid: u32,
}

impl Mount {
    /// Mounts `device` on `mountpoint` with `cairn -o options` (background mode).
    pub fn new(device: &Path, mountpoint: &Path, options: &str) -> Mount {
        let output = Self::try_mount(device, mountpoint, options);
        assert!(
            output.status.success(),
            "cairn failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Self::adopt(device, mountpoint)
    }

    /// Runs the mount command and returns its output, mounted or not.
    pub fn try_mount(device: &Path, mountpoint: &Path, options: &str) -> Output {
        let mut command = Command::new(cairn_bin());
        let options = transport_options(options);
        if !options.is_empty() {
            command.args(["-o", &options]);
        }
        command.arg(device).arg(mountpoint);
        with_ring_enabled(|| command.output().unwrap())
    }

    /// Takes charge of a mount made some other way (mount -t fuse.cairn, fstab).
    pub fn adopt(device: &Path, mountpoint: &Path) -> Mount {
        let mount = Self::adopt_any_transport(device, mountpoint);
        let want = match ring_transport() {
            true => "io_uring",
            false => "/dev/fuse",
        };
        let served = served_transport(mountpoint);
        assert_eq!(served, want, "the mount is not on the test transport");
        mount
    }

    /// Takes charge of a mount whichever transport serves it.
    pub fn adopt_any_transport(device: &Path, mountpoint: &Path) -> Mount {
        assert!(
            is_mounted(mountpoint),
            "{} is not mounted",
            mountpoint.display()
        );
        let pids = pids_mentioning(mountpoint.to_str().unwrap());
        assert_eq!(pids.len(), 1, "expected one daemon, found {pids:?}");
        Mount {
            mountpoint: mountpoint.to_owned(),
            device: device.to_owned(),
            pid: pids[0],
        }
    }

    /// Unmounts and waits until the daemon has written everything back and exited.
    pub fn unmount(self) {
        let output = run("umount", &[self.mountpoint.to_str().unwrap()]);
        assert!(output.status.success(), "umount: {output:?}");
        assert!(
            wait_exit(self.pid, EXIT_WAIT),
            "daemon {} did not exit",
            self.pid
        );
        std::mem::forget(self);
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid as i32, signal) };
    }

    /// The path of `name` inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let mountpoint = self.mountpoint.to_str().unwrap();
        let _ = run("fusermount3", &["-u", "-z", mountpoint]);
        if is_mounted(&self.mountpoint) {
            let _ = run("umount", &["-l", mountpoint]);
        }
        if !wait_exit(self.pid, Duration::from_secs(20)) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
            wait_exit(self.pid, Duration::from_secs(10));
        }
    }
}

/// sha256sum of every file under `dir`, as `sha256sum` prints it, sorted by path.
pub fn checksums(dir: &Path) -> String {
    sh(&format!(
        "cd '{}' && find . -type f -print0 | sort -z | xargs -0 -r sha256sum",
        dir.display()
    ))
}

/// Standard output then standard error of a finished command, as text.
pub fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The unprivileged user the permission tests act as (nobody).
pub const NOBODY: u32 = 65534;

/// A Python interpreter every user may run (a per-user one, such as pyenv's under /root,
/// is out of reach of an unprivileged user).
pub fn python() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .unwrap_or("python3")
}

/// Runs `program args` as user and group `id` with no supplementary groups (`setpriv`), or
/// as root for `None`.
pub fn run_as(id: Option<u32>, program: &str, args: &[&str]) -> Output {
    let Some(id) = id else {
        return run(program, args);
    };
    let (uid, gid) = (format!("--reuid={id}"), format!("--regid={id}"));
    let mut argv = vec![uid.as_str(), gid.as_str(), "--clear-groups", "--", program];
    argv.extend_from_slice(args);
    run("setpriv", &argv)
}

/// Runs a Python `script` with `args` as `id` (root for `None`); panics with its output
/// unless it succeeds.
pub fn python_as(id: Option<u32>, script: &str, args: &[&str]) -> String {
    let mut argv = vec!["-c", script];
    argv.extend_from_slice(args);
    let output = run_as(id, python(), &argv);
    let text = output_text(&output);
    assert!(output.status.success(), "python as {id:?} failed:\n{text}");
    text
}

/// Python helpers the permission scripts share: `fails(call, "EPERM")` asserts that a call
/// fails with that errno; `mode(path)` is the permission bits.
pub const PY_PRELUDE: &str = r#"
import errno, os, stat, sys
def fails(call, name):
    try:
        call()
    except OSError as e:
        assert e.errno == getattr(errno, name), f"{call}: {e} (want {name})"
        return
    raise AssertionError(f"{call}: succeeded (want {name})")
def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)
"#;

/// Runs a shell `script` as `id` (root for `None`) in directory `dir`; panics with its output
/// unless it succeeds, and returns its standard output.
pub fn sh_as(id: Option<u32>, dir: &Path, script: &str) -> String {
    let script = format!("cd '{}'\n{script}", dir.display());
    let output = run_as(id, "sh", &["-ec", &script]);
    assert!(
        output.status.success(),
        "`{script}` as {id:?} failed:\n{}",
        output_text(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A private name for the built binary in /usr/local/sbin, where mount.fuse3 finds the
/// program a `fuse.NAME` type names; removed on drop. Private to this test process, so
/// concurrent runs from other checkouts cannot swap it for their build.
pub struct HelperName {
    link: PathBuf,
    pub name: String,
}

impl HelperName {
    pub fn new() -> HelperName {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("cairn-test-{}-{serial}", std::process::id());
        let link = Path::new("/usr/local/sbin").join(&name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(cairn_bin(), &link).unwrap();
        HelperName { link, name }
    }
}

impl Drop for HelperName {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
    }
}

/// Whether answer `got` is the expected line `want`, or one of its alternatives
/// (`check: a || check: b`).
pub fn matches(want: Option<&&str>, got: Option<&&str>) -> bool {
    match (want, got) {
        (Some(want), Some(got)) => want.split(" || ").any(|w| w == *got),
        (None, None) => true,
        _ => false,
    }
}

/// Asserts that `got` has exactly the non-comment lines of `expected`, naming every
/// difference.
pub fn same_answers(what: &str, expected: &str, got: &str) {
    let want: Vec<&str> = expected.lines().filter(|l| !l.starts_with('#')).collect();
    let have: Vec<&str> = got.lines().collect();
    let mut differences = Vec::new();
    for index in 0..want.len().max(have.len()) {
        let (w, h) = (want.get(index), have.get(index));
        if !matches(w, h) {
            differences.push(format!("  want {w:?}\n  got  {h:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{what}: {} answers differ from XFS's:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
