"""Inode flags through the standard interfaces, run in directory argv[1] as root: chattr and
lsattr for every flag, FS_IOC_GETFLAGS/SETFLAGS and FS_IOC_FSGETXATTR/FSSETXATTR (extent
size hints, their inheritance, project ids), and what each of immutable (i) and append-only
(a) refuses, on files and directories, including through descriptors opened before the flag
was set. Prints one line per check ("name: ok [result]" or "name: ERRNO"), compared by
crates/fuse/tests/flags.rs with expected.txt (kernel XFS's answers)."""
import errno, fcntl, os, stat, struct, subprocess, sys, time
d = os.path.abspath(sys.argv[1])
out = []
def res(name, call):
    try:
        r = call()
        out.append(f"{name}: ok" + (f" {r}" if r is not None else ""))
    except OSError as e:
        out.append(f"{name}: {errno.errorcode[e.errno]}")
def p(*parts):
    return os.path.join(d, *parts)
def mkfile(path, data=b""):
    with open(path, "wb") as f:
        f.write(data)
def content(path):
    with open(path, "rb") as f:
        return f.read()
GETFLAGS, SETFLAGS = 0x80086601, 0x40086602
FSGETXATTR, FSSETXATTR = 0x801C581F, 0x401C5820
SYNC, IMMUTABLE, APPEND, NODUMP, NOATIME = 0x8, 0x10, 0x20, 0x40, 0x80
EXTENTS, PROJINHERIT_FL = 0x80000, 0x20000000
X_EXTSIZE, X_EXTSZINHERIT, X_PROJINHERIT = 0x800, 0x1000, 0x200
def opened(path):
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0)
    return os.open(path, flags)
def getflags(path):
    fd = opened(path)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, GETFLAGS, buf)
        return struct.unpack("<I", buf)[0]
    finally:
        os.close(fd)
def setflags(path, flags):
    fd = opened(path)
    try:
        fcntl.ioctl(fd, SETFLAGS, struct.pack("<I", flags))
    finally:
        os.close(fd)
def getx(path):
    fd = opened(path)
    try:
        buf = bytearray(28)
        fcntl.ioctl(fd, FSGETXATTR, buf)
        return struct.unpack("<5I8x", buf)
    finally:
        os.close(fd)
def setx(path, xflags, extsize, projid=None):
    old = getx(path)
    fd = opened(path)
    try:
        projid = old[3] if projid is None else projid
        raw = struct.pack("<5I8x", xflags, extsize, 0, projid, 0)
        fcntl.ioctl(fd, FSSETXATTR, raw)
    finally:
        os.close(fd)
# FS_XFLAG_HASATTR (XFS gives every inode an attribute fork here) and fsx_nextents (XFS
# counts delayed extents, cairn only mapped ones) are left out.
def xattr_view(path):
    xflags, extsize, _, projid, _ = getx(path)
    return f"xflags={xflags & 0x7FFFFFFF:#x} extsize={extsize} projid={projid}"
def lsattr(path):
    args = ["lsattr", "-d", path] if os.path.isdir(path) else ["lsattr", path]
    run = subprocess.run(args, capture_output=True, text=True)
    return run.stdout.split()[0] if run.returncode == 0 else "failed"
def chattr(change, path):
    run = subprocess.run(["chattr", change, path], capture_output=True, text=True)
    if run.returncode != 0:
        raise OSError(errno.EPERM, run.stderr.strip())
os.chdir(d)
# --- every flag through chattr and lsattr, and both ioctl views
mkfile(p("f"), b"data")
res("fresh lsattr", lambda: lsattr(p("f")))
res("fresh getflags", lambda: hex(getflags(p("f"))))
res("fresh fsgetxattr", lambda: xattr_view(p("f")))
for letter in "iaASd":
    def round_trip(letter=letter):
        chattr("+" + letter, p("f"))
        shown = (lsattr(p("f")), hex(getflags(p("f"))), hex(getx(p("f"))[0] & 0x7FFFFFFF))
        chattr("-" + letter, p("f"))
        return shown + (lsattr(p("f")),)
    res(f"chattr {letter}", round_trip)
res("setflags all five", lambda: setflags(p("f"), SYNC | IMMUTABLE | APPEND | NODUMP | NOATIME))
res("all five shown", lambda: (lsattr(p("f")), hex(getflags(p("f"))), xattr_view(p("f"))))
res("setflags none", lambda: setflags(p("f"), 0))
res("setflags unknown flag", lambda: setflags(p("f"), EXTENTS))
res("setflags projinherit on file", lambda: setflags(p("f"), PROJINHERIT_FL))
res("flags after refusals", lambda: hex(getflags(p("f"))))
res("fssetxattr nodump", lambda: setx(p("f"), 0x80, 0))
res("nodump through getflags", lambda: hex(getflags(p("f"))))
res("fssetxattr clears", lambda: setx(p("f"), 0, 0))
res("fssetxattr unknown xflag", lambda: setx(p("f"), 0x40000000, 0))
os.mkdir(p("dflags"))
for letter in "iaASd":
    def dir_round_trip(letter=letter):
        chattr("+" + letter, p("dflags"))
        shown = (lsattr(p("dflags")), hex(getflags(p("dflags"))))
        chattr("-" + letter, p("dflags"))
        return shown
    res(f"dir chattr {letter}", dir_round_trip)
res("stat blocks of chattr'd file", lambda: os.stat(p("f")).st_size)
# --- immutable file
mkfile(p("imm"), b"0123456789")
os.setxattr(p("imm"), "user.kept", b"1")
wfd = os.open(p("imm"), os.O_RDWR)
afd = os.open(p("imm"), os.O_WRONLY | os.O_APPEND)
chattr("+i", p("imm"))
res("imm open rdonly", lambda: os.close(os.open(p("imm"), os.O_RDONLY)))
res("imm open wronly", lambda: os.open(p("imm"), os.O_WRONLY))
res("imm open rdwr", lambda: os.open(p("imm"), os.O_RDWR))
res("imm open append", lambda: os.open(p("imm"), os.O_WRONLY | os.O_APPEND))
res("imm open trunc", lambda: os.open(p("imm"), os.O_RDONLY | os.O_TRUNC))
res("imm open creat", lambda: os.close(os.open(p("imm"), os.O_RDONLY | os.O_CREAT)))
res("imm truncate", lambda: os.truncate(p("imm"), 2))
res("imm chmod", lambda: os.chmod(p("imm"), 0o600))
res("imm chown", lambda: os.chown(p("imm"), 1, 1))
res("imm chown same", lambda: os.chown(p("imm"), 0, 0))
res("imm utime now", lambda: os.utime(p("imm")))
res("imm utime explicit", lambda: os.utime(p("imm"), (5, 5)))
res("imm setxattr", lambda: os.setxattr(p("imm"), "user.x", b"1"))
res("imm removexattr", lambda: os.removexattr(p("imm"), "user.kept"))
res("imm getxattr", lambda: os.getxattr(p("imm"), "user.kept"))
res("imm unlink", lambda: os.unlink(p("imm")))
res("imm rename", lambda: os.rename(p("imm"), p("imm2")))
mkfile(p("other"), b"other")
res("imm rename over", lambda: os.rename(p("other"), p("imm")))
res("imm link", lambda: os.link(p("imm"), p("immlink")))
res("imm read", lambda: content(p("imm")))
res("imm write through earlier fd", lambda: os.pwrite(wfd, b"AB", 0))
res("imm append through earlier fd", lambda: os.write(afd, b"Z"))
res("imm fsync earlier fd", lambda: os.fsync(wfd))
res("imm contents after writes", lambda: content(p("imm")))
res("imm ftruncate earlier fd", lambda: os.ftruncate(wfd, 4))
res("imm fchmod earlier fd", lambda: os.fchmod(wfd, 0o600))
res("imm futimens earlier fd", lambda: os.utime(wfd, (7, 7)))
res("imm fallocate earlier fd", lambda: os.posix_fallocate(wfd, 0, 65536))
res("imm fsetxattr earlier fd", lambda: os.setxattr(wfd, "user.y", b"1"))
res("imm size", lambda: os.stat(p("imm")).st_size)
res("imm chattr +d while immutable", lambda: chattr("+d", p("imm")))
res("imm flags", lambda: lsattr(p("imm")))
os.close(wfd)
os.close(afd)
res("imm contents after close", lambda: content(p("imm")))
res("imm chattr -i", lambda: chattr("-i", p("imm")))
res("imm open wronly after -i", lambda: os.close(os.open(p("imm"), os.O_WRONLY)))
res("imm unlink after -id", lambda: (chattr("-d", p("imm")), os.unlink(p("imm")))[1])
# --- append-only file
mkfile(p("app"), b"0123456789")
wfd = os.open(p("app"), os.O_RDWR)
chattr("+a", p("app"))
res("app open rdonly", lambda: os.close(os.open(p("app"), os.O_RDONLY)))
res("app open wronly", lambda: os.open(p("app"), os.O_WRONLY))
res("app open rdwr", lambda: os.open(p("app"), os.O_RDWR))
res("app open append trunc", lambda: os.open(p("app"), os.O_WRONLY | os.O_APPEND | os.O_TRUNC))
def append_write():
    fd = os.open(p("app"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"+tail")
        os.pwrite(fd, b"P", 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return content(p("app"))
res("app append and pwrite", append_write)
res("app rdwr append", lambda: os.close(os.open(p("app"), os.O_RDWR | os.O_APPEND)))
res("app truncate", lambda: os.truncate(p("app"), 2))
res("app truncate same size", lambda: os.truncate(p("app"), os.stat(p("app")).st_size))
res("app chmod", lambda: os.chmod(p("app"), 0o600))
res("app chown", lambda: os.chown(p("app"), 1, 1))
res("app utime now", lambda: os.utime(p("app")))
res("app utime explicit", lambda: os.utime(p("app"), (5, 5)))
res("app setxattr", lambda: os.setxattr(p("app"), "user.x", b"1"))
res("app unlink", lambda: os.unlink(p("app")))
res("app rename", lambda: os.rename(p("app"), p("app2")))
res("app rename over", lambda: os.rename(p("other"), p("app")))
res("app link", lambda: os.link(p("app"), p("applink")))
def falloc(mode, offset, length):
    fd = os.open(p("app"), os.O_WRONLY | os.O_APPEND)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        if libc.fallocate(fd, mode, offset, length) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")
    finally:
        os.close(fd)
res("app fallocate", lambda: falloc(0, 0, 65536))
res("app fallocate keep size", lambda: falloc(1, 0, 131072))
res("app punch hole", lambda: falloc(3, 0, 4096))
res("app ftruncate earlier fd", lambda: os.ftruncate(wfd, 2))
res("app fchmod earlier fd", lambda: os.fchmod(wfd, 0o600))
res("app size", lambda: os.stat(p("app")).st_size)
res("app pwrite through earlier fd", lambda: os.pwrite(wfd, b"Q", 0))
res("app fsync earlier fd", lambda: os.fsync(wfd))
res("app contents after earlier fd", lambda: content(p("app"))[:12])
res("app size after earlier fd", lambda: os.stat(p("app")).st_size)
def fcntl_drop_append():
    fd = os.open(p("app"), os.O_WRONLY | os.O_APPEND)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, 0)
    finally:
        os.close(fd)
res("app fcntl drop append", fcntl_drop_append)
def write_after_fcntl_drop():
    fd = os.open(p("app"), os.O_WRONLY | os.O_APPEND)
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, 0)
        except OSError:
            pass
        os.pwrite(fd, b"X", 0)
    finally:
        os.close(fd)
    return content(p("app"))[:1]
res("app write after fcntl drop", write_after_fcntl_drop)
os.close(wfd)
res("app chattr -a", lambda: chattr("-a", p("app")))
res("app truncate after -a", lambda: os.truncate(p("app"), 2))
# --- immutable directory
os.mkdir(p("idir"))
mkfile(p("idir", "in"), b"in")
os.mkdir(p("idir", "sub"))
chattr("+i", p("idir"))
res("idir create", lambda: mkfile(p("idir", "new")))
res("idir mkdir", lambda: os.mkdir(p("idir", "newdir")))
res("idir symlink", lambda: os.symlink("x", p("idir", "sl")))
res("idir mknod", lambda: os.mkfifo(p("idir", "fifo")))
res("idir link into", lambda: os.link(p("other"), p("idir", "l")))
res("idir unlink", lambda: os.unlink(p("idir", "in")))
res("idir rmdir", lambda: os.rmdir(p("idir", "sub")))
res("idir rename within", lambda: os.rename(p("idir", "in"), p("idir", "in2")))
res("idir rename out", lambda: os.rename(p("idir", "in"), p("out")))
res("idir rename in", lambda: os.rename(p("other"), p("idir", "other")))
res("idir chmod", lambda: os.chmod(p("idir"), 0o700))
res("idir setxattr", lambda: os.setxattr(p("idir"), "user.x", b"1"))
res("idir list", lambda: sorted(os.listdir(p("idir"))))
res("idir write child", lambda: mkfile(p("idir", "in"), b"changed"))
res("idir child contents", lambda: content(p("idir", "in")))
res("idir rmdir itself", lambda: os.rmdir(p("idir")))
chattr("-i", p("idir"))
# --- append-only directory
os.mkdir(p("adir"))
mkfile(p("adir", "in"), b"in")
os.mkdir(p("adir", "sub"))
chattr("+a", p("adir"))
res("adir create", lambda: mkfile(p("adir", "new")))
res("adir mkdir", lambda: os.mkdir(p("adir", "newdir")))
res("adir link into", lambda: os.link(p("other"), p("adir", "l")))
res("adir unlink", lambda: os.unlink(p("adir", "in")))
res("adir rmdir", lambda: os.rmdir(p("adir", "sub")))
res("adir rename within", lambda: os.rename(p("adir", "in"), p("adir", "in2")))
res("adir rename out", lambda: os.rename(p("adir", "in"), p("out")))
res("adir rename in", lambda: os.rename(p("other"), p("adir", "other")))
res("adir chmod", lambda: os.chmod(p("adir"), 0o700))
res("adir utime now", lambda: os.utime(p("adir")))
res("adir setxattr", lambda: os.setxattr(p("adir"), "user.x", b"1"))
res("adir list", lambda: sorted(os.listdir(p("adir"))))
res("adir new file inherits nothing", lambda: lsattr(p("adir", "new")))
chattr("-a", p("adir"))
# --- no-atime: a read of a file whose atime is older than its mtime leaves it
def atime_after_read(path):
    import mmap
    os.utime(path, (1_000_000_000, 1_000_000_100))
    # O_DIRECT: a read from the page cache never reaches a FUSE daemon (docs/fuse.md).
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.preadv(fd, [mmap.mmap(-1, 4096)], 0)
    finally:
        os.close(fd)
    return os.stat(path).st_atime == 1_000_000_000
mkfile(p("noat"), b"x" * 100)
mkfile(p("at"), b"x" * 100)
chattr("+A", p("noat"))
res("noatime read keeps atime", lambda: atime_after_read(p("noat")))
res("plain read updates atime", lambda: atime_after_read(p("at")))
os.mkdir(p("noatdir"))
chattr("+A", p("noatdir"))
res("noatime dir new file flags", lambda: lsattr(p("noatdir", "x")) if mkfile(p("noatdir", "x")) is None else None)
os.mkdir(p("inh"))
chattr("+S", p("inh")); chattr("+d", p("inh")); chattr("+A", p("inh"))
mkfile(p("inh", "f"))
os.mkdir(p("inh", "sub"))
res("inherited by file", lambda: lsattr(p("inh", "f")))
res("inherited by dir", lambda: lsattr(p("inh", "sub")))
# --- extent size hints and project ids through FS_IOC_FSSETXATTR
MIB = 1 << 20
mkfile(p("h"))
res("hint set on empty file", lambda: setx(p("h"), X_EXTSIZE, MIB))
res("hint read back", lambda: xattr_view(p("h")))
res("hint not block multiple", lambda: setx(p("h"), X_EXTSIZE, MIB + 512))
res("hint without flag", lambda: setx(p("h"), 0, 2 * MIB))
res("hint after flagless set", lambda: xattr_view(p("h")))
res("hint set again", lambda: setx(p("h"), X_EXTSIZE, 2 * MIB))
res("hint inherit flag on file", lambda: setx(p("h"), X_EXTSZINHERIT, MIB))
res("hint zero clears", lambda: setx(p("h"), X_EXTSIZE, 0))
res("hint after zero", lambda: xattr_view(p("h")))
res("hint huge", lambda: setx(p("h"), X_EXTSIZE, 1 << 31))
mkfile(p("hdata"), b"y" * 8192)
res("hint on file with data", lambda: setx(p("hdata"), X_EXTSIZE, MIB))
res("hint on file with data view", lambda: xattr_view(p("hdata")))
res("hint on file with data unchanged", lambda: setx(p("hdata"), 0, 0))
os.mkdir(p("hd"))
res("dir hint with extsize flag", lambda: setx(p("hd"), X_EXTSIZE, MIB))
res("dir hint inherit", lambda: setx(p("hd"), X_EXTSZINHERIT, 4 * MIB))
res("dir hint view", lambda: xattr_view(p("hd")))
mkfile(p("hd", "child"))
os.mkdir(p("hd", "subdir"))
res("child inherits hint", lambda: xattr_view(p("hd", "child")))
res("subdir inherits hint", lambda: xattr_view(p("hd", "subdir")))
mkfile(p("hd", "subdir", "grandchild"))
res("grandchild inherits hint", lambda: xattr_view(p("hd", "subdir", "grandchild")))
os.symlink("child", p("hd", "sl"))
os.mkfifo(p("hd", "fifo"))
res("dir hint cleared", lambda: setx(p("hd"), 0, 0))
mkfile(p("hd", "later"))
res("no hint after clear", lambda: xattr_view(p("hd", "later")))
res("hint write", lambda: (mkfile(p("hd", "child"), b"z" * 5000), os.stat(p("hd", "child")).st_size)[1])
os.mkdir(p("pd"))
res("projid on dir", lambda: setx(p("pd"), X_PROJINHERIT, 0, 42))
res("projid view", lambda: (xattr_view(p("pd")), lsattr(p("pd"))))
mkfile(p("pd", "child"))
os.mkdir(p("pd", "sub"))
res("child projid", lambda: xattr_view(p("pd", "child")))
res("subdir projid", lambda: xattr_view(p("pd", "sub")))
res("projid on file", lambda: setx(p("f"), 0, 0, 7))
res("file projid view", lambda: xattr_view(p("f")))
res("projinherit on file", lambda: setx(p("f"), X_PROJINHERIT, 0, 7))
res("file after projinherit", lambda: xattr_view(p("f")))
res("projid via chattr -p", lambda: (subprocess.run(["chattr", "-p", "9", p("f")], check=True), xattr_view(p("f")))[1])
res("lsattr -p", lambda: subprocess.run(["lsattr", "-p", p("f")], capture_output=True, text=True).stdout.split()[0])
print("\n".join(out))
