"""What fstests' generic/423 checks of statx(2), in directory argv[1]: a FIFO, a character
device, a directory, a block device, a file, a symlink, a socket and a hard link, each
made after the one before; every one reports the basic fields and the birth time, with
btime <= atime, btime <= mtime <= ctime, the birth and modification times of each no
earlier than the previous object's, and the hard link's fields those of its file. Also: the
birth time lies within the creation, stays through changes, equals what `stat -c %W`
shows, and the statx attribute bits lie within their mask. Raises on the first failure."""
import ctypes, os, socket, stat, struct, subprocess, sys, time
d = os.path.abspath(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_NOFOLLOW = -100, 0x100
STATX_BASIC_STATS, STATX_BTIME = 0x7FF, 0x800
def p(name):
    return os.path.join(d, "423-" + name)
def statx(path, mask=STATX_BASIC_STATS | STATX_BTIME):
    buf = ctypes.create_string_buffer(256)
    if libc.statx(AT_FDCWD, path.encode(), AT_SYMLINK_NOFOLLOW, mask, buf) != 0:
        raise OSError(ctypes.get_errno(), path)
    raw = buf.raw
    s = {}
    (s["mask"], s["blksize"], s["attributes"], s["nlink"], s["uid"], s["gid"], s["mode"]) = \
        struct.unpack_from("<IIQIIIH", raw, 0)
    (s["ino"], s["size"], s["blocks"], s["attributes_mask"]) = struct.unpack_from("<QQQQ", raw, 32)
    for index, name in enumerate(["atime", "btime", "ctime", "mtime"]):
        sec, nsec = struct.unpack_from("<qI", raw, 64 + 16 * index)
        s[name] = sec * 10**9 + nsec
    (s["rdev_major"], s["rdev_minor"]) = struct.unpack_from("<II", raw, 128)
    return s
def check(cond, what, s=None):
    if not cond:
        raise AssertionError(f"{what}: {s}")
def check_stat(path, kind, mode=None, rdev=(0, 0), nlink=1, size=None, ref=None):
    s = statx(path)
    want_mask = STATX_BASIC_STATS | STATX_BTIME
    check(s["mask"] & want_mask == want_mask, f"{path} mask {s['mask']:#x}", s)
    check(stat.S_IFMT(s["mode"]) == kind, f"{path} type", s)
    if mode is not None:
        check(stat.S_IMODE(s["mode"]) == mode, f"{path} mode", s)
    check((s["rdev_major"], s["rdev_minor"]) == rdev, f"{path} rdev", s)
    if nlink is not None:
        check(s["nlink"] == nlink, f"{path} nlink", s)
    if size is not None:
        check(s["size"] == size, f"{path} size", s)
    check(s["btime"] <= s["atime"], f"{path} btime after atime", s)
    check(s["btime"] <= s["mtime"] <= s["ctime"], f"{path} btime, mtime, ctime order", s)
    if ref is not None:
        check(ref["btime"] <= s["btime"], f"{path} born before the previous object", s)
        check(ref["mtime"] <= s["mtime"], f"{path} modified before the previous object", s)
    check(s["attributes"] & ~s["attributes_mask"] == 0, f"{path} attributes outside mask", s)
    plain = os.lstat(path)
    same = (plain.st_ino, plain.st_size, plain.st_nlink, plain.st_mode, plain.st_mtime_ns)
    check(same == (s["ino"], s["size"], s["nlink"], s["mode"], s["mtime"]), f"{path} stat", s)
    return s
before = time.time_ns()
os.mkfifo(p("fifo"), 0o600)
ref = check_stat(p("fifo"), stat.S_IFIFO, 0o600)
check(before - 10**9 <= ref["btime"] <= time.time_ns() + 10**9, "btime not the creation time")
os.mknod(p("null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
ref = check_stat(p("null"), stat.S_IFCHR, 0o600, (1, 3), ref=ref)
os.mkdir(p("dir"), 0o755)
ref = dirref = check_stat(p("dir"), stat.S_IFDIR, 0o755, nlink=None, ref=ref)
os.mknod(p("loopy"), 0o600 | stat.S_IFBLK, os.makedev(7, 123))
ref = check_stat(p("loopy"), stat.S_IFBLK, 0o600, (7, 123), ref=ref)
with open(p("file"), "wb") as f:
    f.write(bytes(20480))
ref = fileref = check_stat(p("file"), stat.S_IFREG, size=20480, ref=ref)
target = p("nowhere")
os.symlink(target, p("symlink"))
ref = check_stat(p("symlink"), stat.S_IFLNK, size=len(target), ref=ref)
sock = socket.socket(socket.AF_UNIX)
sock.bind(p("sock"))
sock.close()
ref = sockref = check_stat(p("sock"), stat.S_IFSOCK, ref=ref)
os.link(p("file"), p("link"))
link = check_stat(p("link"), stat.S_IFREG, nlink=2)
check(dirref["btime"] <= link["btime"] <= sockref["btime"], "link btime is not the file's", link)
check(link["ctime"] >= sockref["btime"], "link did not change ctime", link)
again = statx(p("file"))
check(again == link, "the link's statx differs from its file's", (again, link))
born = link["btime"]
time.sleep(0.02)
with open(p("file"), "r+b") as f:
    f.write(b"changed")
os.chmod(p("file"), 0o600)
os.rename(p("file"), p("renamed"))
after = statx(p("renamed"))
check(after["btime"] == born, "btime moved", after)
check(after["mtime"] > born and after["ctime"] > born, "times did not move", after)
shown = subprocess.run(["stat", "-c", "%W %w", p("renamed")], capture_output=True, text=True)
seconds, text = shown.stdout.split(" ", 1)
check(int(seconds) == born // 10**9 and text.strip() != "-", "stat -c %W %w", shown.stdout)
subprocess.run(["chattr", "+i", p("renamed")], check=True)
flagged = statx(p("renamed"))
check(flagged["attributes"] & ~flagged["attributes_mask"] == 0, "attributes outside mask")
subprocess.run(["chattr", "-i", p("renamed")], check=True)
print("ok")
