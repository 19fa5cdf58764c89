"""Permission behaviours, run in directory argv[1]: "setup" (as root) makes the tree, "run"
(as an unprivileged user) checks sticky directories, directory write and search rights,
file modes, owner-only changes, trusted attributes and device nodes. Prints one line per
check, compared by crates/fuse/tests/posix.rs with expected_user.txt (kernel XFS's)."""
import errno, os, stat, sys
d = os.path.abspath(sys.argv[1])
setup = sys.argv[2] == "setup"
out = []
def res(name, call):
    try:
        r = call()
        out.append(f"{name}: ok" + (f" {r}" if r is not None else ""))
    except OSError as e:
        out.append(f"{name}: {errno.errorcode[e.errno]}")
def p(*parts):
    return os.path.join(d, *parts)
def mkfile(path, mode=0o644):
    with open(path, "w") as f:
        f.write("x")
    os.chmod(path, mode)
if setup:
    os.mkdir(p("sticky")); os.chmod(p("sticky"), 0o1777)
    mkfile(p("sticky", "roots"), 0o666)
    os.mkdir(p("sticky", "rootdir"), 0o777); os.chmod(p("sticky", "rootdir"), 0o777)
    os.mkdir(p("closed")); os.chmod(p("closed"), 0o755)
    mkfile(p("closed", "f"), 0o644)
    os.mkdir(p("nosearch")); mkfile(p("nosearch", "f")); os.chmod(p("nosearch"), 0o744)
    os.mkdir(p("noread")); mkfile(p("noread", "f")); os.chmod(p("noread"), 0o711)
    mkfile(p("private"), 0o600)
    mkfile(p("execonly"), 0o711)
    os.mkdir(p("open")); os.chmod(p("open"), 0o777)
    mkfile(p("open", "roots"), 0o644)
    sys.exit(0)
res("sticky unlink others", lambda: os.unlink(p("sticky", "roots")))
res("sticky rename others", lambda: os.rename(p("sticky", "roots"), p("sticky", "mine")))
res("sticky rmdir others", lambda: os.rmdir(p("sticky", "rootdir")))
mkfile(p("sticky", "mine"))
res("sticky rename own over others", lambda: os.rename(p("sticky", "mine"), p("sticky", "roots")))
res("sticky unlink own", lambda: os.unlink(p("sticky", "mine")))
res("sticky write others", lambda: open(p("sticky", "roots"), "a").write("y"))
res("create in closed", lambda: mkfile(p("closed", "new")))
res("unlink in closed", lambda: os.unlink(p("closed", "f")))
res("mkdir in closed", lambda: os.mkdir(p("closed", "d")))
res("rename into closed", lambda: os.rename(p("open", "roots"), p("closed", "x")))
res("stat through nosearch", lambda: os.stat(p("nosearch", "f")))
res("list nosearch", lambda: sorted(os.listdir(p("nosearch"))))
res("list noread", lambda: os.listdir(p("noread")))
res("stat through noread", lambda: os.stat(p("noread", "f")).st_size)
res("open private", lambda: open(p("private")).read())
res("access private R", lambda: os.access(p("private"), os.R_OK))
res("exec noexec file", lambda: os.access(p("private"), os.X_OK))
res("read execonly", lambda: open(p("execonly")).read())
res("open roots in open dir for write", lambda: open(p("open", "roots"), "a"))
res("unlink roots in open dir", lambda: os.unlink(p("open", "roots")))
res("chmod others", lambda: os.chmod(p("private"), 0o777))
res("chown to self", lambda: os.chown(p("private"), os.getuid(), -1))
res("utime others explicit", lambda: os.utime(p("private"), (1, 1)))
res("utime others now", lambda: os.utime(p("private")))
res("truncate others", lambda: os.truncate(p("private"), 0))
res("link others file", lambda: os.link(p("private"), p("open", "lnk")))
res("setxattr user others", lambda: os.setxattr(p("private"), "user.x", b"1"))
res("getxattr trusted", lambda: os.getxattr(p("private"), "trusted.x"))
res("setxattr trusted", lambda: os.setxattr(p("open"), "trusted.x", b"1"))
res("mknod chr", lambda: os.mknod(p("open", "chr"), stat.S_IFCHR | 0o600, os.makedev(1, 3)))
print("\n".join(out))
