#!/usr/bin/env python3
"""Locality report of the files a workload wrote: extents per file, a histogram of them,
the fragmentation factor, each extent's distance from the end of the file's previous extent
(the block an appending allocator aims for: its hint) and AG switches within a file.

  extents.py fiemap MNT --from RESULT [--ag-bytes N] --prefix NAME
      kernel filesystems (XFS, ext4): the FS_IOC_FIEMAP ioctl, as filefrag uses it
  extents.py cairn IMAGE --db CAIRN_DB --from RESULT --prefix NAME
      cairn (unmounted): `cairn-db IMAGE bmap PATH` for each file, AGs as cairn-db names them

RESULT is a workload's output (tools/bench/workload.py): its {"files": [...]} line names the
files, relative to the filesystem's root. Prints JSON lines like workload.py, plus one
{"extent_counts": [...]} line for the histogram plot. Physically contiguous extents are
merged first, so the figures do not depend on each filesystem's largest extent length.
"""

import argparse
import fcntl
import json
import os
import re
import statistics
import struct
import subprocess
import sys

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 1
FIEMAP_HEADER = struct.Struct("=QQIIII")
FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_BATCH = 512
HISTOGRAM_BUCKETS = ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", ">64"]


def fiemap(path):
    """The file's extents as (logical, physical, length) in bytes, in file order."""
    extents, start = [], 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            buf = bytearray(FIEMAP_HEADER.size + FIEMAP_EXTENT.size * FIEMAP_BATCH)
            FIEMAP_HEADER.pack_into(buf, 0, start, (1 << 64) - 1 - start, FIEMAP_FLAG_SYNC, 0,
                                    FIEMAP_BATCH, 0)
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
            mapped = FIEMAP_HEADER.unpack_from(buf, 0)[3]
            last = False
            for i in range(mapped):
                at = FIEMAP_HEADER.size + i * FIEMAP_EXTENT.size
                fields = FIEMAP_EXTENT.unpack_from(buf, at)
                logical, physical, length, flags = fields[0], fields[1], fields[2], fields[5]
                extents.append((logical, physical, length, None))
                last = bool(flags & FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                return extents
            start = extents[-1][0] + extents[-1][2]
    finally:
        os.close(fd)


BMAP_LINE = re.compile(
    r"^\d+: \[(\d+)\.\.(\d+)\]: (\d+)\.\.(\d+) AG (\d+) \((\d+)\.\.(\d+)\) (\d+) blocks")


def cairn_block_size(db, image):
    text = subprocess.run([db, image, "sb"], check=True, stdout=subprocess.PIPE,
                          text=True).stdout
    found = re.search(r"\bblock_size: (\d+)", text)
    if not found:
        raise SystemExit("cairn-db sb printed no block_size")
    return int(found.group(1))


def cairn_bmap(db, image, relpath, block):
    """A file's extents from `cairn-db bmap`, with the AG cairn-db names for each."""
    text = subprocess.run([db, image, "bmap", "/" + relpath], check=True,
                          stdout=subprocess.PIPE, text=True).stdout
    extents = []
    for line in text.splitlines():
        found = BMAP_LINE.match(line)
        if found:
            file_block, fs_block, ag, length = (int(found.group(i)) for i in (1, 3, 5, 8))
            extents.append((file_block * block, fs_block * block, length * block, ag))
    return extents


def merged(extents, size):
    """Extents that hold file data (below `size`), physically contiguous ones merged."""
    out = []
    for logical, physical, length, ag in sorted(extents):
        if size is not None and logical >= size:
            continue
        if out:
            p_logical, p_physical, p_length, p_ag = out[-1]
            if p_logical + p_length == logical and p_physical + p_length == physical:
                out[-1] = (p_logical, p_physical, p_length + length, p_ag)
                continue
        out.append((logical, physical, length, ag))
    return out


def bucket(count):
    for name in HISTOGRAM_BUCKETS[:-1]:
        low, _, high = name.partition("-")
        if int(low) <= count <= int(high or low):
            return name
    return HISTOGRAM_BUCKETS[-1]


def ag_of(extent, ag_bytes):
    if extent[3] is not None:
        return extent[3]
    return extent[1] // ag_bytes if ag_bytes else None


def summarise(per_file, prefix, ag_bytes):
    counts, distances, switches = [], [], []
    for extents in per_file:
        if not extents:
            continue
        counts.append(len(extents))
        ags = [ag_of(e, ag_bytes) for e in extents]
        for prev, cur in zip(extents, extents[1:]):
            distances.append(abs(cur[1] - (prev[1] + prev[2])))
        if ags[0] is not None:
            switches.append(sum(1 for a, b in zip(ags, ags[1:]) if a != b))
    if not counts:
        raise SystemExit("no file had data extents")
    actual, ideal = sum(counts), len(counts)
    emit(f"{prefix}: extents per file, mean", statistics.mean(counts), "extents")
    emit(f"{prefix}: extents per file, max", max(counts), "extents")
    emit(f"{prefix}: files in one extent", 100 * counts.count(1) / len(counts), "%")
    emit(f"{prefix}: fragmentation factor", 100 * (actual - ideal) / actual, "%")
    if distances:
        emit(f"{prefix}: distance from hint, median", statistics.median(distances) / (1 << 20),
             "MiB")
    else:
        emit(f"{prefix}: distance from hint, median", None, "n/a: every file in one extent")
    if switches:
        emit(f"{prefix}: AG switches per file, mean", statistics.mean(switches), "switches")
    else:
        emit(f"{prefix}: AG switches per file, mean", None, "n/a: no AGs")
    print(json.dumps({"extent_counts": {"prefix": prefix, "counts": counts}}))


def emit(metric, value, unit):
    print(json.dumps({"metric": metric, "value": value, "unit": unit}), flush=True)


def workload_files(result_path):
    with open(result_path) as result:
        for line in result:
            record = json.loads(line)
            if "files" in record:
                sizes = record.get("sizes") or [None] * len(record["files"])
                return list(zip(record["files"], sizes))
    raise SystemExit(f"{result_path}: no files line")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="backend", required=True)
    p = sub.add_parser("fiemap")
    p.add_argument("mountpoint")
    p.add_argument("--ag-bytes", type=int, default=0, help="AG size, 0 = no AGs")
    p = sub.add_parser("cairn")
    p.add_argument("image")
    p.add_argument("--db", required=True, help="the cairn-db binary")
    for p in sub.choices.values():
        p.add_argument("--from", dest="result", required=True)
        p.add_argument("--prefix", required=True)
    args = parser.parse_args(argv)
    files = workload_files(args.result)
    per_file = []
    if args.backend == "fiemap":
        for relpath, size in files:
            path = os.path.join(args.mountpoint, relpath)
            per_file.append(merged(fiemap(path), size or os.path.getsize(path)))
        summarise(per_file, args.prefix, args.ag_bytes)
    else:
        block = cairn_block_size(args.db, args.image)
        for relpath, size in files:
            per_file.append(merged(cairn_bmap(args.db, args.image, relpath, block), size))
        summarise(per_file, args.prefix, 0)


if __name__ == "__main__":
    main(sys.argv[1:])
