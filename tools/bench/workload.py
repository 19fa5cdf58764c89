#!/usr/bin/env python3
"""Filesystem workloads runnable against any mounted directory.

Each subcommand runs one workload under MOUNTPOINT and prints its figures as JSON lines,
{"metric": NAME, "value": NUMBER, "unit": UNIT}, plus {"files": [...]} lines naming the
files whose extents a locality report should look at. tools/bench-compare runs them on
every filesystem side by side.

  createunlink MNT --files N --workers W   empty files: create all, sync, unlink all, sync
      [--create-only]                      (or only create and sync)
  append MNT --mib M --writers W           512 KiB O_DIRECT writes, fsync after each
  fill MNT --percent P --writers W         random file sizes until P% of the fs is used
  untar MNT TARBALL                        tar -x then sync; find (stat every entry); rm -r
  find MNT / rm MNT                        the find and remove phases alone (after a remount)
  fio MNT --phase write|seqread|random     fio, buffered and O_DIRECT (remount between phases)

With --cairn-stats CAIRN (createunlink, untar, find, rm on a cairn mount), each timed phase
also prints the FUSE requests it cost, read with `CAIRN stats MNT` right before and after it
(tools/bench/cairn_stats.py), as a {"requests": {...}} line.

"sync" is make_durable(): syncfs, then a new file fsynced (syncfs does not reach a FUSE
daemon's log; on cairn `cairn sync MNT` does, but the other filesystems have no such command). Needs only the Python standard library. Workers are processes (not threads),
so the GIL does not serialise them.
"""

import argparse
import ctypes
import json
import math
import mmap
import multiprocessing
import multiprocessing.connection
import os
import random
import subprocess
import sys
import tarfile
import threading
import time

from cairn_stats import PhaseCounter

LIBC = ctypes.CDLL(None, use_errno=True)
APPEND_CHUNK = 512 << 10
FILES_PER_DIR = 1000
FILL_WRITE = 1 << 20


def emit(metric, value, unit):
    print(json.dumps({"metric": metric, "value": value, "unit": unit}), flush=True)


def syncfs(path):
    """Writes back the filesystem holding `path` (and only that one)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if LIBC.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def make_durable(mountpoint):
    """Makes everything done so far durable: syncfs, then create and fsync a new marker file.

    syncfs alone is not enough on FUSE: the kernel sends SYNCFS only to virtiofs, so a FUSE
    daemon gets the dirty pages but no request to force its log (`cairn sync MNT` asks cairn's
    daemon directly; the marker works on every filesystem). The marker's creation is
    the newest metadata change, and fsync forces the log (one ordered stream) up to it, with
    everything before; kernel filesystems do the same for an fsync. So each filesystem pays
    for the same durability."""
    syncfs(mountpoint)
    global MARKERS
    MARKERS += 1
    fd = os.open(os.path.join(mountpoint, f".durable-{os.getpid()}-{MARKERS}"),
                 os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MARKERS = 0


def run_workers(count, target, args, on_ready=None):
    """Runs `target(index, *args, gate)` in `count` processes; returns the wall time between
    the start gate and the end gate. Each target prepares, calls gate.start(), does the
    measured work and calls gate.end(). `on_ready` runs once every worker has prepared,
    before the start (it is not timed). A worker that fails breaks the gates, so the others
    and the parent stop waiting, and its error ends the workload."""
    ctx = multiprocessing.get_context("fork")
    gate = Gate(ctx.Barrier(count + 1), ctx.SimpleQueue())
    procs = [ctx.Process(target=guarded, args=(target, i, args, gate)) for i in range(count)]
    for proc in procs:
        proc.start()
    threading.Thread(target=watch, args=(procs, gate.barrier), daemon=True).start()
    try:
        gate.barrier.wait()
        if on_ready:
            on_ready()
        gate.barrier.wait()
        start = time.perf_counter()
        gate.barrier.wait()
        elapsed = time.perf_counter() - start
    except threading.BrokenBarrierError:
        elapsed = None
    except BaseException:
        gate.barrier.abort()  # the workers must not wait for a parent that has given up
        raise
    for proc in procs:
        proc.join()
    failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
    if failed or elapsed is None:
        reason = gate.errors.get() if not gate.errors.empty() else f"exit {failed}"
        raise SystemExit(f"a worker failed: {reason}")
    return elapsed


def watch(procs, barrier):
    """Breaks the barrier when a worker dies without a word (a signal, os._exit). It looks at
    an exit without reaping it (WNOWAIT): the parent joins the workers too, and of two
    threads reaping one child the loser reads no exit code (None), which used to fail a run
    whose workers all succeeded."""
    pending = {proc.sentinel: proc for proc in procs}
    while pending:
        for sentinel in multiprocessing.connection.wait(list(pending)):
            proc = pending.pop(sentinel)
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                continue  # the parent has reaped it: the gates are passed
            if info.si_code != os.CLD_EXITED or info.si_status != 0:
                barrier.abort()
                return


class Gate:
    """The barriers a worker passes, ready and start (gate.start()) and end (gate.end()),
    and where a failing worker leaves its error."""

    def __init__(self, barrier, errors):
        self.barrier, self.errors = barrier, errors

    def start(self):
        self.barrier.wait()
        self.barrier.wait()

    def end(self):
        self.barrier.wait()


def guarded(target, index, args, gate):
    """Runs a worker; on a failure leaves its error and breaks the barrier, so nobody waits
    for this worker any more."""
    try:
        target(index, *args, gate)
    except threading.BrokenBarrierError:
        raise SystemExit(1)  # another worker failed and said why
    except BaseException as err:
        gate.errors.put(f"worker {index}: {type(err).__name__}: {err}")
        gate.barrier.abort()
        raise


def file_names(root, worker, count):
    dirs = max(1, math.ceil(count / FILES_PER_DIR))
    return [f"{root}/w{worker}/d{i % dirs}/f{i}" for i in range(count)]


def create_worker(index, root, count, gate):
    names = file_names(root, index, count)
    for d in sorted({os.path.dirname(n) for n in names}):
        os.makedirs(d, exist_ok=True)
    gate.start()
    for name in names:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    gate.end()


def unlink_worker(index, root, count, gate):
    names = file_names(root, index, count)
    gate.start()
    for name in names:
        os.unlink(name)
    gate.end()


def timed_phase(args, counter, phase, target, workload_args, files):
    """Runs `target` in args.workers processes, then make_durable(); returns the seconds
    of both; counts the FUSE requests of both (counter) as phase `phase`."""
    elapsed = run_workers(args.workers, target, workload_args, on_ready=counter.start)
    start = time.perf_counter()
    make_durable(args.mountpoint)
    elapsed += time.perf_counter() - start
    counter.stop(phase, files)
    return elapsed


def cmd_createunlink(args):
    root = os.path.join(args.mountpoint, f"cu{args.workers}")
    per_worker = args.files // args.workers
    total = per_worker * args.workers
    counter = PhaseCounter(args.cairn_stats, args.mountpoint)
    created = timed_phase(args, counter, "create", create_worker, (root, per_worker), total)
    if args.create_only:
        clients = f"{args.workers} client" + ("s" if args.workers > 1 else "")
        emit(f"create empty files, {clients}", total / created, "files/s")
        return
    removed = timed_phase(args, counter, "unlink", unlink_worker, (root, per_worker), total)
    emit(f"create empty files, {args.workers} thr", total / created, "files/s")
    emit(f"unlink empty files, {args.workers} thr", total / removed, "files/s")


def append_worker(index, root, mib, gate):
    path = f"{root}/file{index}"
    buf = mmap.mmap(-1, APPEND_CHUNK)  # page-aligned, as O_DIRECT needs
    buf.write(bytes([index + 1]) * APPEND_CHUNK)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    gate.start()
    for _ in range(mib * (1 << 20) // APPEND_CHUNK):
        written = os.write(fd, buf)
        if written != APPEND_CHUNK:
            raise SystemExit(f"{path}: short O_DIRECT write of {written} bytes")
        os.fsync(fd)
    os.close(fd)
    gate.end()


def cmd_append(args):
    root = os.path.join(args.mountpoint, "append")
    os.makedirs(root, exist_ok=True)
    probe = os.path.join(root, "probe")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644))
    except OSError as err:
        emit("O_DIRECT append, 2 writers", None, f"n/a: O_DIRECT open: {err.strerror}")
        return
    os.unlink(probe)
    elapsed = run_workers(args.writers, append_worker, (root, args.mib))
    total_mib = args.mib * args.writers
    emit(f"O_DIRECT 512K append+fsync, {args.writers} writers", total_mib / elapsed, "MiB/s")
    names = [f"append/file{i}" for i in range(args.writers)]
    print(json.dumps({"files": names, "sizes": [args.mib << 20] * args.writers}))


def fill_sizes(rng, need_bytes, min_bytes, max_bytes):
    """File sizes, log-uniform between min and max (4 KiB multiples), summing to need."""
    sizes, total = [], 0
    low, high = math.log(min_bytes), math.log(max_bytes)
    while total < need_bytes:
        size = int(math.exp(rng.uniform(low, high))) // 4096 * 4096
        size = max(min_bytes, min(size, need_bytes - total))
        size = max(4096, size // 4096 * 4096)
        sizes.append(size)
        total += size
    return sizes


def fill_worker(index, root, sizes, writers, gate):
    block = os.urandom(FILL_WRITE)
    os.makedirs(f"{root}/w{index}", exist_ok=True)
    gate.start()
    for number in range(index, len(sizes), writers):
        remaining = sizes[number]
        with open(f"{root}/w{index}/f{number}", "wb", buffering=0) as out:
            while remaining > 0:
                step = min(remaining, FILL_WRITE)
                out.write(block[:step])
                remaining -= step
    gate.end()


def cmd_fill(args):
    st = os.statvfs(args.mountpoint)
    total = st.f_blocks * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    need = int(total * args.percent / 100) - used
    if need <= 0:
        raise SystemExit(f"{args.mountpoint} is already {used * 100 // total}% full")
    rng = random.Random(args.seed)
    sizes = fill_sizes(rng, need, 4096, args.max_mib << 20)
    root = os.path.join(args.mountpoint, "fill")
    elapsed = run_workers(args.writers, fill_worker, (root, sizes, args.writers))
    start = time.perf_counter()
    make_durable(args.mountpoint)
    elapsed += time.perf_counter() - start
    st = os.statvfs(args.mountpoint)
    used_pct = (st.f_blocks - st.f_bfree) * 100 / st.f_blocks
    emit(f"fill to {args.percent}%, {args.writers} writers", sum(sizes) / elapsed / (1 << 20),
         "MiB/s")
    emit("fill: files written", len(sizes), "files")
    emit("fill: space used after", used_pct, "% used")
    names = [f"fill/w{n % args.writers}/f{n}" for n in range(len(sizes))]
    print(json.dumps({"files": names, "sizes": sizes}))


def count_entries(root):
    """(entries, regular files) under root."""
    entries = files = 0
    for top, dirs, names in os.walk(root):
        entries += len(dirs) + len(names)
        files += sum(1 for name in names if os.path.isfile(os.path.join(top, name)))
    return entries, files


def cmd_untar(args):
    root = os.path.join(args.mountpoint, "tree")
    os.makedirs(root, exist_ok=True)
    with tarfile.open(args.tarball) as tar:
        files = sum(1 for member in tar if member.isfile())
    counter = PhaseCounter(args.cairn_stats, args.mountpoint)
    counter.start()
    start = time.perf_counter()
    subprocess.run(["tar", "-xf", args.tarball, "-C", root], check=True)
    make_durable(args.mountpoint)
    elapsed = time.perf_counter() - start
    counter.stop("untar", files)
    entries, _ = count_entries(root)
    size_mib = os.path.getsize(args.tarball) / (1 << 20)
    emit("source tree: untar + sync", entries / elapsed, "entries/s")
    emit("source tree: untar + sync (data)", size_mib / elapsed, "MiB/s")
    emit("source tree: entries", entries, "entries")


def cmd_find(args):
    root = os.path.join(args.mountpoint, "tree")
    counter = PhaseCounter(args.cairn_stats, args.mountpoint)
    counter.start()
    start = time.perf_counter()
    # %s needs each entry's attributes: a stat of everything, as `ls -lR` does.
    out = subprocess.run(["find", root, "-printf", "%y %s\n"], check=True,
                         stdout=subprocess.PIPE).stdout
    elapsed = time.perf_counter() - start
    lines = out.splitlines()
    counter.stop("find", sum(1 for line in lines if line.startswith(b"f ")))
    emit("source tree: find + stat (cold)", len(lines) / elapsed, "entries/s")


def cmd_rm(args):
    root = os.path.join(args.mountpoint, "tree")
    entries, files = count_entries(root)
    counter = PhaseCounter(args.cairn_stats, args.mountpoint)
    counter.start()
    start = time.perf_counter()
    subprocess.run(["rm", "-rf", root], check=True)
    make_durable(args.mountpoint)
    elapsed = time.perf_counter() - start
    counter.stop("rm", files)
    emit("source tree: rm -r + sync", entries / elapsed, "entries/s")


# fio jobs of each phase: metric, file, O_DIRECT, rw, block size, unit. The write phase lays
# out both files; the read phases follow a remount, so they start cold.
FIO_PHASES = {
    "write": [
        ("fio seq write 1M, buffered + end fsync", "fio-buffered", 0, "write", "1M", "MiB/s"),
        ("fio seq write 1M, O_DIRECT + end fsync", "fio-direct", 1, "write", "1M", "MiB/s"),
    ],
    "seqread": [
        ("fio seq read 1M, buffered (cold)", "fio-buffered", 0, "read", "1M", "MiB/s"),
        ("fio seq read 1M, O_DIRECT", "fio-direct", 1, "read", "1M", "MiB/s"),
    ],
    "random": [
        ("fio rand read 4K, buffered (cold)", "fio-buffered", 0, "randread", "4k", "IOPS"),
        ("fio rand read 4K, O_DIRECT", "fio-direct", 1, "randread", "4k", "IOPS"),
        ("fio rand write 4K, buffered + end fsync", "fio-buffered", 0, "randwrite", "4k", "IOPS"),
        ("fio rand write 4K, buffered + fsync every 32", "fio-buffered", 0, "randwrite", "4k",
         "IOPS"),
        ("fio rand write 4K, O_DIRECT", "fio-direct", 1, "randwrite", "4k", "IOPS"),
    ],
}


def cmd_fio(args):
    import shutil

    for metric, name, direct, rw, bs, unit in FIO_PHASES[args.phase]:
        if not shutil.which("fio"):
            emit(metric, None, "n/a: fio not installed")
            continue
        command = ["fio", "--name=" + name, "--filename=" + os.path.join(args.mountpoint, name),
                   "--size=" + args.size, "--bs=" + bs, "--rw=" + rw, "--ioengine=psync",
                   f"--direct={direct}", "--output-format=json"]
        if rw.startswith("rand"):
            command += ["--time_based", f"--runtime={args.runtime}", "--randrepeat=0"]
        if "write" in rw:
            command += ["--end_fsync=1"]
        if "fsync every 32" in metric:
            command += ["--fsync=32"]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
            emit(metric, None, f"n/a: {reason[:80]}")
            continue
        job = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]
        side = job["write" if "write" in rw else "read"]
        if unit == "IOPS":
            emit(metric, side["iops"], unit)
        else:
            emit(metric, side["bw_bytes"] / (1 << 20), unit)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    counted = argparse.ArgumentParser(add_help=False)
    counted.add_argument("--cairn-stats", metavar="CAIRN", default=None,
                         help="count each phase's FUSE requests with `CAIRN stats MNT`")
    p = sub.add_parser("createunlink", parents=[counted])
    p.add_argument("mountpoint")
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--create-only", action="store_true", help="no unlink phase")
    p = sub.add_parser("append")
    p.add_argument("mountpoint")
    p.add_argument("--mib", type=int, default=64, help="MiB per file")
    p.add_argument("--writers", type=int, default=2)
    p = sub.add_parser("fill")
    p.add_argument("mountpoint")
    p.add_argument("--percent", type=int, default=70)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--max-mib", type=int, default=256, help="largest file")
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("untar", parents=[counted])
    p.add_argument("mountpoint")
    p.add_argument("tarball")
    for name in ("find", "rm"):
        sub.add_parser(name, parents=[counted]).add_argument("mountpoint")
    p = sub.add_parser("fio")
    p.add_argument("mountpoint")
    p.add_argument("--phase", choices=sorted(FIO_PHASES), required=True)
    p.add_argument("--size", default="512M", help="file size")
    p.add_argument("--runtime", type=int, default=4, help="seconds per random job")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    if not os.path.isdir(args.mountpoint):
        raise SystemExit(f"{args.mountpoint}: not a directory")
    globals()["cmd_" + args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
