"""POSIX behaviours a conformance suite checks, run in directory argv[1] as root: errno
cases of long names, symlink loops, ENOTDIR/EISDIR, rmdir and rename corners, O_EXCL,
descriptor modes, link counts, and which timestamps of which inodes each call changes.
Prints one line per check ("name: ok [result]" or "name: ERRNO"), compared by
crates/fuse/tests/posix.rs with expected.txt (kernel XFS's answers)."""
import errno, os, stat, sys, time
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
os.chdir(d)
# --- names
long = "n" * 256
ok255 = "n" * 255
res("create 255", lambda: mkfile(p(ok255)))
res("create 256", lambda: mkfile(p(long)))
res("mkdir 256", lambda: os.mkdir(p(long)))
res("symlink name 256", lambda: os.symlink("x", p(long)))
res("link to 256", lambda: os.link(p(ok255), p(long)))
res("rename to 256", lambda: os.rename(p(ok255), p(long)))
res("unlink 256", lambda: os.unlink(p(long)))
res("stat 256", lambda: os.stat(p(long)))
res("unlink 255", lambda: os.unlink(p(ok255)))
# --- symlink loops
os.symlink("loop2", p("loop1")); os.symlink("loop1", p("loop2"))
res("open loop", lambda: os.open(p("loop1"), os.O_RDONLY))
res("stat loop", lambda: os.stat(p("loop1")))
res("lstat loop", lambda: stat.S_ISLNK(os.lstat(p("loop1")).st_mode))
res("open nofollow symlink", lambda: os.open(p("loop1"), os.O_RDONLY | os.O_NOFOLLOW))
res("mkdir through loop", lambda: os.mkdir(p("loop1", "x")))
# --- ENOTDIR / EISDIR
mkfile(p("file"), b"data")
os.mkdir(p("dir"))
res("open file/x", lambda: os.open(p("file", "x"), os.O_RDONLY))
res("create file/x", lambda: os.open(p("file", "x"), os.O_CREAT | os.O_WRONLY))
res("mkdir file/x", lambda: os.mkdir(p("file", "x")))
res("rmdir file", lambda: os.rmdir(p("file")))
res("opendir file", lambda: os.open(p("file"), os.O_RDONLY | os.O_DIRECTORY))
res("open dir write", lambda: os.open(p("dir"), os.O_WRONLY))
res("open dir rdwr", lambda: os.open(p("dir"), os.O_RDWR))
res("open dir creat", lambda: os.open(p("dir"), os.O_CREAT | os.O_RDONLY))
res("unlink dir", lambda: os.unlink(p("dir")))
res("truncate dir", lambda: os.truncate(p("dir"), 0))
res("readlink file", lambda: os.readlink(p("file")))
res("file trailing slash", lambda: os.stat(p("file") + "/"))
res("create trailing slash", lambda: os.open(p("newf") + "/", os.O_CREAT | os.O_WRONLY))
res("mkdir trailing slash", lambda: os.mkdir(p("newd") + "/"))
res("rmdir trailing slash", lambda: os.rmdir(p("newd") + "/"))
# --- rmdir / rename corners
os.mkdir(p("full")); mkfile(p("full", "x"))
res("rmdir nonempty", lambda: os.rmdir(p("full")))
res("rmdir dot", lambda: os.rmdir(p("dir", ".")))
res("rmdir dotdot", lambda: os.rmdir(p("dir", "..")))
res("rename dir into itself", lambda: os.rename(p("dir"), p("dir", "sub")))
os.mkdir(p("dir", "sub"))
res("rename dir into own child", lambda: os.rename(p("dir"), p("dir", "sub", "x")))
res("rename dir over file", lambda: os.rename(p("dir"), p("file")))
res("rename file over dir", lambda: os.rename(p("file"), p("dir")))
res("rename dir over nonempty", lambda: os.rename(p("dir", "sub"), p("full")))
os.mkdir(p("empty"))
res("rename dir over empty dir", lambda: os.rename(p("empty"), p("dir", "sub")))
res("rename missing", lambda: os.rename(p("missing"), p("x")))
res("rename to missing dir", lambda: os.rename(p("file"), p("missing", "x")))
res("rename self", lambda: os.rename(p("file"), p("file")))
os.link(p("file"), p("hard"))
res("rename hardlink onto other name", lambda: os.rename(p("file"), p("hard")))
res("both hardlink names remain", lambda: (os.path.exists(p("file")), os.path.exists(p("hard"))))
res("rename dot", lambda: os.rename(p("dir", "."), p("x")))
res("rename to dotdot", lambda: os.rename(p("hard"), p("dir", "..")))
# --- O_EXCL and friends
res("excl existing", lambda: os.open(p("file"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
os.symlink("dangling-target", p("dangle"))
res("excl dangling symlink", lambda: os.open(p("dangle"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
def creat_through(link):
    os.close(os.open(p(link), os.O_CREAT | os.O_WRONLY, 0o644))
    return os.path.exists(p("dangling-target"))
res("creat through dangling symlink", lambda: creat_through("dangle"))
res("mkdir existing", lambda: os.mkdir(p("dir")))
res("mkdir over symlink", lambda: os.mkdir(p("dangle")))
res("link existing", lambda: os.link(p("file"), p("hard")))
res("symlink existing", lambda: os.symlink("x", p("file")))
res("link dir", lambda: os.link(p("dir"), p("dirlink")))
res("link missing", lambda: os.link(p("missing"), p("x")))
res("link into missing dir", lambda: os.link(p("file"), p("missing", "x")))
def fifo():
    os.mkfifo(p("fifo"))
    return stat.S_ISFIFO(os.stat(p("fifo")).st_mode)
res("mknod fifo", fifo)
res("unlink missing", lambda: os.unlink(p("missing")))
res("open missing", lambda: os.open(p("missing"), os.O_RDONLY))
res("empty path", lambda: os.stat(""))
# --- file descriptor semantics
fd = os.open(p("file"), os.O_RDONLY)
res("write rdonly", lambda: os.write(fd, b"x"))
res("ftruncate rdonly", lambda: os.ftruncate(fd, 0))
os.close(fd)
fd = os.open(p("file"), os.O_WRONLY)
res("read wronly", lambda: os.read(fd, 1))
os.close(fd)
fd = os.open(p("file"), os.O_WRONLY | os.O_APPEND)
os.write(fd, b"tail")
res("append size", lambda: os.fstat(fd).st_size)
os.close(fd)
res("truncate negative", lambda: os.truncate(p("file"), -1))
res("lseek negative", lambda: os.lseek(os.open(p("file"), os.O_RDONLY), -5, os.SEEK_SET))
# --- link counts
def nl(*parts): return os.lstat(p(*parts)).st_nlink
os.mkdir(p("lc"))
res("new dir nlink", lambda: nl("lc"))
os.mkdir(p("lc", "a")); os.mkdir(p("lc", "b"))
res("dir nlink with 2 subdirs", lambda: nl("lc"))
os.rmdir(p("lc", "b"))
res("dir nlink after rmdir", lambda: nl("lc"))
os.mkdir(p("lc2"))
os.rename(p("lc", "a"), p("lc2", "a"))
res("nlinks after dir move", lambda: (nl("lc"), nl("lc2")))
mkfile(p("lc", "f"))
os.link(p("lc", "f"), p("lc", "g"))
res("file nlink 2", lambda: nl("lc", "f"))
os.rename(p("lc", "g"), p("lc2", "g"))
res("file nlink after rename", lambda: nl("lc", "f"))
os.unlink(p("lc2", "g"))
res("file nlink after unlink", lambda: nl("lc", "f"))
fd = os.open(p("lc", "f"), os.O_RDONLY)
os.unlink(p("lc", "f"))
res("fstat unlinked nlink", lambda: os.fstat(fd).st_nlink)
os.close(fd)
res("symlink nlink", lambda: nl("dangle"))
def rename_over_empty():
    os.mkdir(p("lc", "x"))
    os.mkdir(p("lc", "y"))
    os.rename(p("lc", "x"), p("lc", "y"))
    return nl("lc")
res("dir nlink after rename over empty dir", rename_over_empty)
# --- timestamps: which of a/m/c of which inode change
OLD = 1_000_000_000
def times(path):
    s = os.lstat(path)
    return (s.st_atime_ns, s.st_mtime_ns, s.st_ctime_ns)
def stamp(label, paths, action):
    for q in paths:
        if os.path.lexists(q) and not os.path.islink(q):
            os.utime(q, (OLD, OLD))
    before = {q: times(q) for q in paths if os.path.lexists(q)}
    time.sleep(0.02)
    try:
        action()
    except OSError as e:
        out.append(f"times {label}: {errno.errorcode[e.errno]}")
        return
    changed = []
    for q in paths:
        if q not in before or not os.path.lexists(q):
            continue
        after = times(q)
        flags = "".join(c for c, x, y in zip("amc", before[q], after) if x != y)
        changed.append(f"{os.path.basename(q)}={flags or '-'}")
    out.append(f"times {label}: " + " ".join(changed))
os.mkdir(p("t")); mkfile(p("t", "f"), b"hello"); os.mkdir(p("t", "sub"))
T = p("t"); F = p("t", "f")
stamp("create", [T], lambda: mkfile(p("t", "new")))
stamp("mkdir", [T], lambda: os.mkdir(p("t", "d2")))
stamp("write", [F, T], lambda: open(F, "r+b").write(b"x"))
stamp("read", [F], lambda: open(F, "rb").read())
def read_direct(path):
    import mmap
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    os.preadv(fd, [buf], 0)
    os.close(fd)
stamp("read direct", [F], lambda: read_direct(F))
stamp("truncate", [F, T], lambda: os.truncate(F, 2))
stamp("truncate same size", [F], lambda: os.truncate(F, 2))
stamp("open trunc", [F], lambda: os.close(os.open(F, os.O_WRONLY | os.O_TRUNC)))
stamp("open trunc empty", [F], lambda: os.close(os.open(F, os.O_WRONLY | os.O_TRUNC)))
stamp("chmod", [F, T], lambda: os.chmod(F, 0o600))
stamp("chown", [F], lambda: os.chown(F, 0, 0))
stamp("link", [F, T], lambda: os.link(F, p("t", "f2")))
stamp("unlink", [F, T], lambda: os.unlink(p("t", "f2")))
stamp("rename file", [F, T], lambda: os.rename(F, p("t", "g")))
F = p("t", "g")
stamp("rename across", [F, T, p("t", "sub")], lambda: os.rename(F, p("t", "sub", "g")))
F = p("t", "sub", "g")
D2 = p("t", "d2")
stamp("rename dir across", [D2, T, p("t", "sub")], lambda: os.rename(D2, p("t", "sub", "d2")))
stamp("rmdir", [T], lambda: os.rmdir(p("t", "sub", "d2")))
stamp("symlink", [T], lambda: os.symlink("g", p("t", "sl")))
stamp("setxattr", [F], lambda: os.setxattr(F, "user.a", b"1"))
stamp("removexattr", [F], lambda: os.removexattr(F, "user.a"))
stamp("readdir", [T], lambda: os.listdir(T))
stamp("utime now", [F], lambda: os.utime(F))
stamp("fallocate", [F], lambda: os.posix_fallocate(os.open(F, os.O_RDWR), 0, 8192))
stamp("mknod", [T], lambda: os.mkfifo(p("t", "fifo2")))
print("\n".join(out))
