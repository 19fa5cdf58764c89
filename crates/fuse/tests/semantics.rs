//! Linux semantics through the real kernel FUSE, as root and as an unprivileged user
//! (nobody, through `setpriv`): the set-ID bits a write clears, chown without a change,
//! ftruncate on a descriptor, and the setattr permission rules. The expected values are
//! what kernel XFS does with the same steps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{Mount, NOBODY, PY_PRELUDE, Scratch, fsck, python_as, sh_as};

/// A mounted fresh image whose root every user may write (sticky, like /tmp).
fn shared_mount(scratch: &Scratch) -> Mount {
    scratch.share();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "allow_other");
    fs::set_permissions(&mount.mountpoint, fs::Permissions::from_mode(0o1777)).unwrap();
    mount
}

/// Runs `script` (after the prelude) with the mount point as its argument.
fn script_as(id: Option<u32>, mount: &Mount, script: &str) {
    let script = format!("{PY_PRELUDE}\nd = sys.argv[1]\n{script}");
    python_as(id, &script, &[mount.mountpoint.to_str().unwrap()]);
}

fn finish(mount: Mount) {
    let image = mount.device.clone();
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck after the test");
}

// Item 1: a user who may write a set-user-ID / set-group-ID file writes it and the set-ID
// bits go (setgid also when not group-executable, since the writer is outside the group),
// and so does a file capability;
// a truncate and an O_TRUNC open clear them the same way; root's writes keep them, and a
// chown by root clears them.
#[test]
fn writes_by_other_users_clear_set_id_bits() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let setup = r#"
for name, bits in (("s4777", 0o4777), ("s2777", 0o2777), ("s6777", 0o6777),
                   ("s2767", 0o2767), ("t4777", 0o4777), ("o6777", 0o6777),
                   ("r4777", 0o4777), ("c6755", 0o6755), ("c2745", 0o2745)):
    p = os.path.join(d, name)
    open(p, "w").close()
    os.chmod(p, bits)
# A file capability (VFS_CAP_REVISION_2, effective, CAP_CHOWN permitted): every write drops it.
p = os.path.join(d, "cap")
open(p, "w").close()
os.chmod(p, 0o666)
os.setxattr(p, "security.capability", (0x02000001).to_bytes(4, "little") + bytes([1]) + bytes(15))
"#;
    script_as(None, &mount, setup);
    let writer = r#"
p = os.path.join(d, "cap")
with open(p, "w") as f:
    f.write("x")
assert "security.capability" not in os.listxattr(p)
for name, want in (("s4777", 0o777), ("s2777", 0o777), ("s6777", 0o777), ("s2767", 0o767)):
    p = os.path.join(d, name)
    fd = os.open(p, os.O_WRONLY)
    assert os.write(fd, b"data") == 4
    os.close(fd)
    assert mode(p) == want, (name, oct(mode(p)))
    assert open(p, "rb").read() == b"data"
os.truncate(os.path.join(d, "t4777"), 1)
assert mode(os.path.join(d, "t4777")) == 0o777
os.close(os.open(os.path.join(d, "o6777"), os.O_WRONLY | os.O_TRUNC))
assert mode(os.path.join(d, "o6777")) == 0o777
"#;
    script_as(Some(NOBODY), &mount, writer);
    let root = r#"
p = os.path.join(d, "r4777")
with open(p, "w") as f:
    f.write("root")
    f.flush()
    os.fsync(f.fileno())
assert mode(p) == 0o4777, oct(mode(p))
os.chown(os.path.join(d, "c6755"), 0, -1)
assert mode(os.path.join(d, "c6755")) == 0o755
os.chown(os.path.join(d, "c2745"), 0, -1)
assert mode(os.path.join(d, "c2745")) == 0o2745
"#;
    script_as(None, &mount, root);
    finish(mount);
}

// Item 2: chown(path, -1, -1) and lchown(path, -1, -1) by a user who owns nothing succeed:
// there is nothing to change, so nothing to refuse. A real change is still refused.
#[test]
fn chown_without_a_change_needs_no_ownership() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    script_as(
        None,
        &mount,
        "open(os.path.join(d, 'f'), 'w').close(); os.symlink('f', os.path.join(d, 'l'))",
    );
    let other = r#"
os.chown(os.path.join(d, "f"), -1, -1)
os.lchown(os.path.join(d, "l"), -1, -1)
os.lchown(os.path.join(d, "f"), -1, -1)
fails(lambda: os.chown(os.path.join(d, "f"), 65534, -1), "EPERM")
fails(lambda: os.chown(os.path.join(d, "f"), -1, 65534), "EPERM")
"#;
    script_as(Some(NOBODY), &mount, other);
    script_as(None, &mount, "os.chown(os.path.join(d, 'f'), -1, -1)");
    finish(mount);
}

// Item 3: ftruncate is checked against how the descriptor was opened, not the mode: a file
// created O_RDWR with mode 0 can be written and truncated through that descriptor, while
// a new open of it is refused.
#[test]
fn ftruncate_follows_the_open_descriptor() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let script = r#"
p = os.path.join(d, "mine-%d" % os.getuid())
fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0)
assert mode(p) == 0
assert os.write(fd, b"0123456789") == 10
os.ftruncate(fd, 4)
assert os.fstat(fd).st_size == 4
os.ftruncate(fd, 0)
assert os.fstat(fd).st_size == 0
os.ftruncate(fd, 8192)
assert os.fstat(fd).st_size == 8192
os.close(fd)
if os.getuid() != 0:
    fails(lambda: os.open(p, os.O_RDWR), "EACCES")
    fails(lambda: os.truncate(p, 0), "EACCES")
"#;
    script_as(Some(NOBODY), &mount, script);
    script_as(None, &mount, script);
    finish(mount);
}

// Item 4: the setattr rules for a user who does not own the file. Times set to now need
// only write permission; explicit times, chmod and chown need ownership. The owner may
// change the group only to one of its groups, and its chmod drops setgid when it is not in
// the file's group. Root may do all of it.
#[test]
fn setattr_rules_for_owners_and_others() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let setup = r#"
for name, bits in (("shared", 0o666), ("readonly", 0o644)):
    p = os.path.join(d, name)
    open(p, "w").close()
    os.chmod(p, bits)
    os.utime(p, (1000, 1000))
p = os.path.join(d, "given")
open(p, "w").close()
os.chown(p, 65534, 0)
"#;
    script_as(None, &mount, setup);
    let other = r#"
shared, readonly, given = (os.path.join(d, n) for n in ("shared", "readonly", "given"))
os.utime(shared)
assert os.stat(shared).st_mtime > 1000
fails(lambda: os.utime(shared, (5, 5)), "EPERM")
fails(lambda: os.utime(readonly), "EACCES")
fails(lambda: os.utime(readonly, (5, 5)), "EPERM")
fails(lambda: os.chmod(shared, 0o777), "EPERM")
fails(lambda: os.chown(shared, 65534, -1), "EPERM")
fails(lambda: os.truncate(readonly, 0), "EACCES")
os.truncate(shared, 3)
assert os.stat(shared).st_size == 3
# The owner of "given" is outside its group 0: chgrp to 0 is no change, to 1 is refused,
# and its setgid request is dropped.
os.chown(given, -1, 0)
fails(lambda: os.chown(given, -1, 1), "EPERM")
os.chmod(given, 0o2755)
assert mode(given) == 0o755, oct(mode(given))
os.utime(given, (7, 7))
assert os.stat(given).st_mtime == 7
"#;
    script_as(Some(NOBODY), &mount, other);
    let root = r#"
readonly, given = (os.path.join(d, n) for n in ("readonly", "given"))
os.utime(readonly, (5, 5))
assert os.stat(readonly).st_mtime == 5
os.chmod(given, 0o2755)
assert mode(given) == 0o2755
os.chown(given, 1, 1)
assert (os.stat(given).st_uid, os.stat(given).st_gid) == (1, 1)
"#;
    script_as(None, &mount, root);
    finish(mount);
}

// Item 6: later mount options override earlier ones, across -o arguments too (what mount(8)
// hands over for an fstab line with suid and a command line with nosuid); an unknown
// option is still refused, naming it.
#[test]
fn later_mount_options_override_earlier_ones() {
    let scratch = Scratch::new();
    let image = scratch.format("64M");
    let mnt = scratch.mountpoint();
    let last = common::transport_options("nosuid,noexec");
    let output = common::with_ring_enabled(|| {
        Command::new(common::cairn_bin())
            .args([
                "-o",
                "allow_other,default_permissions,dev,suid,exec",
                "-o",
                &last,
            ])
            .arg(&image)
            .arg(&mnt)
            .output()
            .unwrap()
    });
    assert!(output.status.success(), "{}", common::output_text(&output));
    let mount = Mount::adopt(&image, &mnt);
    let flags = common::mount_flags(&mnt);
    for (present, absent) in [
        ("nosuid", "suid"),
        ("noexec", "exec"),
        ("allow_other", "nodev"),
    ] {
        assert!(
            flags.iter().any(|f| f == present),
            "{present} not in {flags:?}"
        );
        assert!(!flags.iter().any(|f| f == absent), "{absent} in {flags:?}");
    }
    mount.unmount();
    let output = Mount::try_mount(&image, &mnt, "suid,nosuid,frobnicate");
    assert!(!output.status.success());
    let text = common::output_text(&output);
    assert!(text.contains("unknown mount option 'frobnicate'"), "{text}");
    assert!(!common::is_mounted(&mnt));
    assert_eq!(fsck(&image), 0);
}

// Item 5: a file opened O_DIRECT can be mapped (shared and private). Mapped writes, msync,
// direct writes and direct reads interleave at random (seeded) and every read, direct or
// through the mapping, matches a model of the file; the data survives a remount.
#[test]
fn mmap_of_direct_io_files_stays_coherent() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let script = r#"
import mmap, random
SIZE = 256 << 10
p = os.path.join(d, "direct-%d" % os.getuid())
fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
os.ftruncate(fd, SIZE)
shared = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
private = mmap.mmap(fd, SIZE, mmap.MAP_PRIVATE, mmap.PROT_READ)
model = bytearray(SIZE)
buffer = mmap.mmap(-1, 64 << 10)  # page-aligned, as O_DIRECT asks
rng = random.Random(19)
def direct_read(offset, length):
    view = memoryview(buffer)[:length]
    assert os.preadv(fd, [view], offset) == length
    return bytes(view)
for step in range(400):
    block = rng.randrange(SIZE // 4096)
    blocks = rng.randint(1, min(16, SIZE // 4096 - block))
    offset, length = block * 4096, blocks * 4096
    kind = rng.choice(["map-write", "map-write", "msync", "direct-write", "direct-read",
                       "map-read"])
    data = bytes([rng.randrange(256)]) * length
    if kind == "map-write":
        start = offset + rng.randrange(4096)
        end = min(SIZE, start + rng.randint(1, length))
        shared[start:end] = data[: end - start]
        model[start:end] = data[: end - start]
    elif kind == "msync":
        shared.flush()
    elif kind == "direct-write":
        buffer[:length] = data
        assert os.pwritev(fd, [memoryview(buffer)[:length]], offset) == length
        model[offset:offset + length] = data
    elif kind == "direct-read":
        assert direct_read(offset, length) == model[offset:offset + length], (step, kind)
    else:
        assert shared[offset:offset + length] == model[offset:offset + length], (step, kind)
shared.flush()
assert direct_read(0, 64 << 10) == model[: 64 << 10]
assert shared[:] == model
shared.close()
private.close()
os.close(fd)
with open(p, "rb") as f:
    assert f.read() == model
with open(p + ".model", "wb") as f:
    f.write(model)
"#;
    script_as(None, &mount, script);
    script_as(Some(NOBODY), &mount, script);
    let image = mount.device.clone();
    let mnt = mount.mountpoint.clone();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &mnt, "ro");
    for uid in ["0", "65534"] {
        let file = fs::read(mount.path(&format!("direct-{uid}"))).unwrap();
        let model = fs::read(mount.path(&format!("direct-{uid}.model"))).unwrap();
        assert!(
            file == model,
            "direct-{uid} differs from its model after remount"
        );
    }
    mount.unmount();
}

/// Python helpers for file handles: `handle(path)` is the bytes of name_to_handle_at's
/// handle, `open_handle(mount_fd, raw, flags)` opens one (open_by_handle_at).
const PY_HANDLES: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]
def handle(path):
    fh, mount_id = FileHandle(), ctypes.c_int()
    fh.handle_bytes = 128
    if libc.name_to_handle_at(-100, path.encode(), ctypes.byref(fh), ctypes.byref(mount_id), 0):
        raise OSError(ctypes.get_errno(), "name_to_handle_at " + path)
    return bytes(fh)
def open_handle(mount_fd, raw, flags=os.O_RDONLY):
    fd = libc.open_by_handle_at(mount_fd, ctypes.byref(FileHandle.from_buffer_copy(raw)), flags)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "open_by_handle_at")
    return fd
def read_handle(mount_fd, raw):
    fd = open_handle(mount_fd, raw)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)
def drop_inodes():
    # Only dentries and inodes (2): the kernel forgets every unused cairn inode.
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
"#;

// Item 8: name_to_handle_at / open_by_handle_at, on files and directories, while the kernel
// caches the inode, after it dropped it, and after a remount (FUSE_EXPORT_SUPPORT: the
// kernel looks up "." by node id). A handle of a deleted inode is ESTALE, and stays so once
// the inode number is reused (the generation changed).
#[test]
fn file_handles_outlive_the_kernels_inodes() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let first = r#"
os.mkdir(os.path.join(d, "dir"))
for name in ("keep", "gone", "dir/inner"):
    with open(os.path.join(d, name), "w") as f:
        f.write(name)
mount_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
handles = {name: handle(os.path.join(d, name)) for name in ("keep", "gone", "dir", "dir/inner")}
assert read_handle(mount_fd, handles["keep"]) == b"keep"
drop_inodes()
assert read_handle(mount_fd, handles["dir/inner"]) == b"dir/inner"
dir_fd = open_handle(mount_fd, handles["dir"], os.O_RDONLY | os.O_DIRECTORY)
assert os.listdir(dir_fd) == ["inner"]
assert open(os.path.join("/proc/self/fd", str(dir_fd), "inner")).read() == "dir/inner"
os.close(dir_fd)
number = os.stat(os.path.join(d, "gone")).st_ino
os.unlink(os.path.join(d, "gone"))
fails(lambda: read_handle(mount_fd, handles["gone"]), "ESTALE")
drop_inodes()
fails(lambda: read_handle(mount_fd, handles["gone"]), "ESTALE")
reused = False
for i in range(64):
    p = os.path.join(d, "new%d" % i)
    open(p, "w").close()
    reused = reused or os.stat(p).st_ino == number
assert reused, "no new file took the deleted inode's number"
fails(lambda: read_handle(mount_fd, handles["gone"]), "ESTALE")
drop_inodes()
fails(lambda: read_handle(mount_fd, handles["gone"]), "ESTALE")
with open(os.path.join(d, "handles"), "wb") as f:
    for name in ("keep", "gone", "dir", "dir/inner"):
        f.write(handles[name])
"#;
    script_as(None, &mount, &format!("{PY_HANDLES}\n{first}"));
    let (image, mnt) = (mount.device.clone(), mount.mountpoint.clone());
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &mnt, "");
    let second = r#"
raw = open(os.path.join(d, "handles"), "rb").read()
size = len(raw) // 4
keep, gone, folder, inner = (raw[i * size:(i + 1) * size] for i in range(4))
mount_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
assert read_handle(mount_fd, inner) == b"dir/inner"
assert read_handle(mount_fd, keep) == b"keep"
fails(lambda: read_handle(mount_fd, gone), "ESTALE")
dir_fd = open_handle(mount_fd, folder, os.O_RDONLY | os.O_DIRECTORY)
assert os.listdir(dir_fd) == ["inner"]
os.close(dir_fd)
"#;
    script_as(None, &mount, &format!("{PY_HANDLES}\n{second}"));
    finish(mount);
}

// Item 9: the creation time is stored in the inode when the file is made, stays through
// writes, chmod and rename, and `cairn-db inode` shows it (statx shows it too: flags.rs).
#[test]
fn birth_time_is_stored_and_shown() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let now = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.unwrap().as_secs()
    };
    let before = now();
    fs::write(mount.path("born"), b"x").unwrap();
    let after = now();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    fs::write(mount.path("born"), b"changed").unwrap();
    fs::set_permissions(mount.path("born"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(mount.path("born"), mount.path("renamed")).unwrap();
    let number = std::os::unix::fs::MetadataExt::ino(&fs::metadata(mount.path("renamed")).unwrap());
    let image = mount.device.clone();
    finish(mount);
    let device = cairn_fsck::snoop::SnoopDevice::open(&image).unwrap();
    let command = cairn_fsck::db::DbCommand::Inode { number };
    let text = cairn_fsck::db::run(&device, &command).unwrap();
    let btime = text
        .split("btime: Timestamp {")
        .nth(1)
        .expect("no btime shown");
    let seconds: u64 = btime
        .split("seconds: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no btime seconds in:\n{text}"));
    // The inode's times come from the coarse clock, which lags by up to a tick.
    assert!(
        (before.saturating_sub(1)..=after).contains(&seconds),
        "btime {seconds} not in {before}..={after}"
    );
}

// Item 10: POSIX ACLs through the kernel (FUSE_POSIX_ACL), set with setfacl by root and by
// an unprivileged owner: a named user may write what the mode alone forbids; chmod narrows
// the mask; a default ACL is inherited by new files and directories, masks the create mode
// and replaces the umask; cp -a, tar --acls and rsync -A carry the lists; all of it
// survives a remount.
#[test]
fn posix_acls_are_enforced_and_inherited() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let mnt = mount.mountpoint.clone();
    let (nobody, other, stranger) = (Some(NOBODY), Some(1234), Some(1235));
    sh_as(None, &mnt, "echo data > f; chmod 600 f");
    sh_as(nobody, &mnt, "! echo x >> f 2>/dev/null");
    sh_as(None, &mnt, "setfacl -m u:65534:rw f");
    sh_as(nobody, &mnt, "echo nobody >> f");
    let acl = sh_as(nobody, &mnt, "getfacl -n f");
    assert!(
        acl.contains("user:65534:rw-") && acl.contains("mask::rw-"),
        "{acl}"
    );
    sh_as(None, &mnt, "chmod 640 f");
    sh_as(
        nobody,
        &mnt,
        "! echo x >> f 2>/dev/null; test \"$(cat f)\" = \"$(printf 'data\\nnobody')\"",
    );
    assert!(sh_as(None, &mnt, "getfacl -n f").contains("mask::r--"));
    // Nobody owns d and gives uid 1234 a default ACL; its umask 077 does not apply below.
    let setup = "mkdir d && setfacl -d -m u:1234:rwx,g::r-x,o::--- d && umask 077 && \
                 echo made > d/file && mkdir d/sub && echo deeper > d/sub/file && \
                 stat -c %a d/file d/sub";
    assert_eq!(sh_as(nobody, &mnt, setup), "660\n770\n");
    assert!(sh_as(nobody, &mnt, "getfacl -n d/file").contains("user:1234:rwx\t#effective:rw-"));
    assert!(sh_as(nobody, &mnt, "getfacl -n d/sub").contains("default:user:1234:rwx"));
    // uid 1234 made d/sub/new: its ACL gives nobody (neither owner nor named) nothing.
    sh_as(
        other,
        &mnt,
        "echo other >> d/file && echo other >> d/sub/file && touch d/sub/new",
    );
    sh_as(nobody, &mnt, "! cat d/sub/new 2>/dev/null");
    sh_as(
        stranger,
        &mnt,
        "! cat d/file 2>/dev/null && ! touch d/x 2>/dev/null",
    );
    let carried = "cp -a d copy && tar --acls -cf d.tar d && mkdir untar && \
                   tar --acls -xf d.tar -C untar && rsync -aA d/ synced/ && \
                   acl() { getfacl -n \"$1\" | tail -n +2; } && \
                   for t in copy untar/d synced; do \
                     test \"$(acl d/file)\" = \"$(acl $t/file)\"; \
                     test \"$(acl d/sub)\" = \"$(acl $t/sub)\"; \
                   done";
    sh_as(None, &mnt, carried);
    let (image, before) = (mount.device.clone(), sh_as(None, &mnt, "getfacl -nR d f"));
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &mnt, "allow_other");
    assert_eq!(sh_as(None, &mnt, "getfacl -nR d f"), before);
    sh_as(other, &mnt, "echo again >> d/file");
    finish(mount);
}

// Item 7: thousands of attributes on one file through the kernel (the fork grows into the
// index form; it used to stop with ENOSPC after about a hundred), values up to 64 KiB, by
// root and by nobody on its own file; they survive a remount, most are removed, fsck is
// clean throughout. More than 64 KiB of names cannot be listed (E2BIG, as on XFS).
#[test]
fn thousands_of_attributes_on_one_file() {
    let scratch = Scratch::new();
    let mount = shared_mount(&scratch);
    let fill = r#"
p = os.path.join(d, "many-%d" % os.getuid())
open(p, "w").close()
count = 10000 if os.getuid() == 0 else 2000
def value(i):
    size = 65536 if i % 997 == 0 else i % 60
    return bytes((i * 7 + k) % 251 for k in range(size))
for i in range(count):
    os.setxattr(p, "user.attribute-%05d" % i, value(i))
if count * len("user.attribute-00000\0") <= 65536:
    assert len(os.listxattr(p)) == count
else:
    # More than 64 KiB of names: no Linux filesystem can list them (XATTR_LIST_MAX).
    fails(lambda: os.listxattr(p), "E2BIG")
assert os.getxattr(p, "user.attribute-00997") == value(997)
assert os.getxattr(p, "user.attribute-%05d" % (count - 1)) == value(count - 1)
"#;
    script_as(None, &mount, fill);
    script_as(Some(NOBODY), &mount, fill);
    let (image, mnt) = (mount.device.clone(), mount.mountpoint.clone());
    mount.unmount();
    assert_eq!(fsck(&image), 0, "fsck with 12,000 attributes");
    let mount = Mount::new(&image, &mnt, "allow_other");
    let check = r#"
p = os.path.join(d, "many-0")
def value(i):
    size = 65536 if i % 997 == 0 else i % 60
    return bytes((i * 7 + k) % 251 for k in range(size))
for i in range(0, 10000, 7):
    assert os.getxattr(p, "user.attribute-%05d" % i) == value(i), i
for i in range(10000):
    if i % 10:
        os.removexattr(p, "user.attribute-%05d" % i)
assert len(os.listxattr(p)) == 1000
fails(lambda: os.getxattr(p, "user.attribute-00001"), "ENODATA")
"#;
    script_as(None, &mount, check);
    finish(mount);
}
