"""Who may change inode flags, run in directory argv[1]: "setup" (as root) makes files owned by
the unprivileged user and by root, "run" (as that user) tries chattr and FS_IOC_FSSETXATTR on
them. Prints one line per check, compared by crates/fuse/tests/flags.rs with
expected_user.txt (kernel XFS's answers)."""
import errno, fcntl, os, struct, subprocess, sys
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
def mkfile(path, mode=0o644, data=b""):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
FSGETXATTR, FSSETXATTR = 0x801C581F, 0x401C5820
def getx(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(28)
        fcntl.ioctl(fd, FSGETXATTR, buf)
        xflags, extsize, _, projid, _ = struct.unpack("<5I8x", buf)
        return f"xflags={xflags & 0x7FFFFFFF:#x} extsize={extsize} projid={projid}"
    finally:
        os.close(fd)
def setx(path, xflags, extsize, projid):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FSSETXATTR, struct.pack("<5I8x", xflags, extsize, 0, projid, 0))
    finally:
        os.close(fd)
def lsattr(path):
    run = subprocess.run(["lsattr", path], capture_output=True, text=True)
    if run.returncode != 0:
        raise OSError(errno.EACCES, run.stderr.strip())
    return run.stdout.split()[0]
def chattr(change, path):
    run = subprocess.run(["chattr", change, path], capture_output=True, text=True)
    if run.returncode != 0:
        raise OSError(errno.EPERM, run.stderr.strip())
    return lsattr(path)
if setup:
    uid = int(sys.argv[3])
    for name in ["mine", "mine_hint", "mine_imm", "mine_app"]:
        mkfile(p(name))
        os.chown(p(name), uid, uid)
    mkfile(p("roots"))
    mkfile(p("private"), 0o600)
    os.mkdir(p("mydir"))
    os.chown(p("mydir"), uid, uid)
    subprocess.run(["chattr", "+i", p("mine_imm")], check=True)
    subprocess.run(["chattr", "+a", p("mine_app")], check=True)
    sys.exit(0)
for letter in "iaASd":
    res(f"chattr +{letter} own file", lambda letter=letter: chattr("+" + letter, p("mine")))
res("chattr +d other's file", lambda: chattr("+d", p("roots")))
res("lsattr other's file", lambda: lsattr(p("roots")))
res("lsattr unreadable file", lambda: lsattr(p("private")))
res("chattr -i own immutable", lambda: chattr("-i", p("mine_imm")))
res("chattr +d own immutable", lambda: chattr("+d", p("mine_imm")))
res("write own immutable", lambda: os.open(p("mine_imm"), os.O_WRONLY))
res("chmod own immutable", lambda: os.chmod(p("mine_imm"), 0o600))
res("chattr -a own append-only", lambda: chattr("-a", p("mine_app")))
res("append own append-only", lambda: os.close(os.open(p("mine_app"), os.O_WRONLY | os.O_APPEND)))
res("write own append-only", lambda: os.open(p("mine_app"), os.O_WRONLY))
res("hint own file", lambda: setx(p("mine_hint"), 0x800, 1 << 20, 0))
res("hint own file view", lambda: getx(p("mine_hint")))
res("hint other's file", lambda: setx(p("roots"), 0x800, 1 << 20, 0))
res("projid own file", lambda: setx(p("mine_hint"), 0x800, 1 << 20, 5))
res("projid own file view", lambda: getx(p("mine_hint")))
res("inherit hint own dir", lambda: setx(p("mydir"), 0x1000, 2 << 20, 0))
res("new file in own dir", lambda: (mkfile(p("mydir", "f")), getx(p("mydir", "f")))[1])
print("\n".join(out))
