"""FUSE requests a workload phase cost a cairn mount, from `cairn stats MOUNTPOINT`.

`cairn stats` ends with a [fuse requests] table: a header line naming the columns
(request, count, errors, avg_us, max_us) and one line per request type the daemon has
answered. The parser finds the columns by their header names and takes every row as a
request type, so types or columns it has never seen pass through (a row it cannot read is
reported on stderr and skipped, and without an avg_us column there are no times).

PhaseCounter reads the table three times around a phase: twice before it (the difference
of those two is what one read costs, e.g. the GETXATTR that fetches the text, which the
daemon counts only after answering it) and once after; the phase's requests are
after - second - (second - first). workload.py prints the result as one JSON line,
{"requests": {"phase", "files", "counts": {type: n}, "daemon_us": {type: us},
"daemon_us_error": {type: us}}} (the last: how far off each daemon time may be, since the
table prints means rounded), or {"requests": {"phase", "error"}} when the stats cannot be
read.
"""

import collections
import json
import subprocess
import sys

SECTION = "[fuse requests]"

# One request type: how many, their total daemon time in us (None without an avg_us
# column) and how far off that total may be: the table prints the mean rounded (avg_us to
# 0.1 us), so count * mean is known to count * half a printed unit.
Row = collections.namedtuple("Row", "count us error")


def parse(text):
    """{type: Row} from the text of `cairn stats`."""
    rows, columns, inside = {}, None, False
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            inside = line.strip() == SECTION
            columns = None
            continue
        if not inside:
            continue
        fields = line.split()
        if columns is None and len(fields) > 1 and not fields[1].isdigit():
            columns = fields  # the header: request count errors avg_us max_us
            continue
        row = parse_row(fields, columns)
        if row is None:
            print(f"cairn_stats: skipping unreadable row {line.strip()!r}", file=sys.stderr)
            continue
        rows[fields[0]] = row
    return rows


def parse_row(fields, columns):
    """The Row of one table line, or None when it does not read as numbers."""
    columns = columns or ["request", "count"]
    at_count = columns.index("count") if "count" in columns else 1
    at_avg = columns.index("avg_us") if "avg_us" in columns else None
    try:
        count = int(fields[at_count])
        if at_avg is None or at_avg >= len(fields):
            return Row(count, None, 0.0)
        mean = fields[at_avg]
        decimals = len(mean.partition(".")[2])
        return Row(count, float(mean) * count, count * 0.5 * 10.0 ** -decimals)
    except (IndexError, ValueError):
        return None


def difference(before, after):
    """after - before, per type; types seen only in one snapshot count from zero."""
    out = {}
    for name in set(before) | set(after):
        old = before.get(name, Row(0, 0.0, 0.0))
        new = after.get(name, Row(0, 0.0, 0.0))
        us = None if new.us is None or old.us is None else new.us - old.us
        out[name] = Row(new.count - old.count, us, new.error + old.error)
    return out


def subtract(phase, overhead):
    """phase - overhead, dropping types left with no request."""
    return {name: Row(row.count, None if row.us is None else max(0.0, row.us), row.error)
            for name, row in difference(overhead, phase).items() if row.count > 0}


class PhaseCounter:
    """Counts the requests between start() and stop(); both are no-ops without a binary."""

    def __init__(self, binary, mountpoint):
        self.binary, self.mountpoint = binary, mountpoint
        self.base = self.overhead = self.error = None

    def read(self):
        done = subprocess.run([self.binary, "stats", self.mountpoint], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise RuntimeError(f"{self.binary} stats {self.mountpoint}: {reason}")
        if SECTION not in done.stdout.splitlines():
            raise RuntimeError(f"{self.binary} stats {self.mountpoint}: no {SECTION} table")
        return parse(done.stdout)

    def start(self):
        if not self.binary:
            return
        self.error = None
        try:
            first = self.read()
            self.base = self.read()
            self.overhead = difference(first, self.base)
        except (OSError, RuntimeError) as err:
            self.error = str(err)

    def stop(self, phase, files):
        if not self.binary:
            return
        record = {"phase": phase, "files": files}
        try:
            if self.error:
                raise RuntimeError(self.error)
            moved = subtract(difference(self.base, self.read()), self.overhead)
            timed = {name: row for name, row in sorted(moved.items()) if row.us is not None}
            record["counts"] = {name: row.count for name, row in sorted(moved.items())}
            record["daemon_us"] = {name: round(row.us, 1) for name, row in timed.items()}
            record["daemon_us_error"] = {name: round(row.error, 1)
                                         for name, row in timed.items()}
        except (OSError, RuntimeError) as err:
            record["error"] = str(err)
        print(json.dumps({"requests": record}), flush=True)
