#!/usr/bin/env python3
"""Turns tools/bench-compare's results into Markdown tables (median and min-max of the runs,
ratios of cairn to XFS, to passthrough_ll and to fuse2fs; cairn's FUSE requests per file;
cairn's thread scaling) and, where matplotlib imports, PNG plots.

  report.py RESULTS.jsonl MACHINE.txt OUT.md [--img-dir DIR]

RESULTS.jsonl holds one JSON object a line, each with "fs" and "run": {"metric", "value",
"unit"} for a figure, {"extent_counts": {"prefix", "counts"}} for a histogram, {"requests":
{"phase", "files", "counts", "daemon_us"}} for the FUSE requests of a phase (or {"requests":
{"phase", "error"}}), {"failed": "WORKLOAD: reason"} for a workload that could not run. A
value of null is a figure the filesystem cannot give; its unit says why ("n/a: ...").
Columns appear for the filesystems the results hold; a figure missing for one of them
(its workload failed or was not run) shows as an em dash.
"""

import argparse
import json
import os
import statistics
import sys

KNOWN_FILESYSTEMS = [("cairn", "cairn"), ("xfs", "XFS"), ("ext4", "ext4"),
                     ("passthrough", "passthrough_ll"), ("fuse2fs", "fuse2fs")]
# The filesystems cairn's ratio columns compare with, in column order.
RATIO_TO = ["xfs", "passthrough", "fuse2fs"]
# cairn's thread-scaling rows: the labels bench-compare records them under.
THREAD_ROWS = ["cairn threads=1", "cairn default threads"]
# The phases of the requests table, in column order (others follow in the order seen).
PHASES = ["create", "unlink", "untar", "find", "rm"]
# Request types whose mean daemon time gets a row of its own.
TIMED_TYPES = ["create", "write"]
DASH = "\u2014"
MICRO = "\u00b5s"
THROUGHPUT_UNITS = {"files/s", "MiB/s", "entries/s", "IOPS", "writes/s"}
# Figures that describe what was measured rather than how well: listed apart, no ratios.
CONTEXT_UNITS = {"files", "entries", "% used"}


class Results:
    """What RESULTS.jsonl holds, grouped for the tables."""

    def __init__(self):
        self.order, self.figures, self.histograms = [], {}, {}
        self.requests = {}  # (fs, phase) -> [record of each run]
        self.request_errors, self.failures = [], []
        self.seen = set()

    def filesystems(self):
        """(fs, name) of the known filesystems with any record, in the usual order."""
        return [(fs, name) for fs, name in KNOWN_FILESYSTEMS if fs in self.seen]

    def add(self, record):
        fs = record.get("fs")
        self.seen.add(fs)
        if "extent_counts" in record:
            entry = record["extent_counts"]
            self.histograms.setdefault((entry["prefix"], fs), []).extend(entry["counts"])
        elif "requests" in record:
            self.add_requests(fs, record["run"], record["requests"])
        elif "failed" in record:
            self.failures.append(f"- {fs}, run {record['run']}: {record['failed']}")
        elif "metric" in record:
            self.add_figure(fs, record)

    def add_requests(self, fs, run, entry):
        if "error" in entry:
            self.request_errors.append(f"- {fs}, run {run}, {entry['phase']}: requests not"
                                       f" counted: {entry['error']}")
        else:
            self.requests.setdefault((fs, entry["phase"]), []).append(entry)

    def add_figure(self, fs, record):
        metric = record["metric"]
        if metric not in self.figures:
            self.figures[metric] = {"unit": None, "values": {}, "notes": {}}
            self.order.append(metric)
        slot = self.figures[metric]
        if record["value"] is None:
            slot["notes"][fs] = record["unit"]
        else:
            slot["unit"] = record["unit"]
            slot["values"].setdefault(fs, []).append(record["value"])


def load(path):
    results = Results()
    with open(path) as lines:
        for line in lines:
            line = line.strip()
            if line.startswith("{"):
                results.add(json.loads(line))
    return results


def fmt(value):
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value):,}"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_small(value):
    """A per-file rate: two decimals, so that one request in a phase still shows."""
    if value == 0:
        return "0"
    if value < 0.01:
        return "<0.01"
    return f"{value:.2f}" if value < 10 else fmt(value)


def spread(values, show=fmt):
    """The median, and (min-max) when the runs differ."""
    text = show(statistics.median(values))
    low, high = show(min(values)), show(max(values))
    if low != high:
        text += f" ({low}-{high})"
    return text


def cell(slot, fs):
    values = slot["values"].get(fs)
    if values:
        return spread(values)
    note = slot["notes"].get(fs)
    if note is None:
        return DASH
    return note.split(":")[0] if note.startswith("n/a") else note


def ratio(slot, fs, other):
    mine, theirs = slot["values"].get(fs), slot["values"].get(other)
    if not mine or not theirs:
        return "-"
    denominator = statistics.median(theirs)
    if denominator == 0:
        return "-"
    value = statistics.median(mine) / denominator
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def table(results, wanted):
    filesystems = results.filesystems()
    names = dict(filesystems)
    others = [fs for fs in RATIO_TO if fs in names and "cairn" in names]
    head = ["workload", "unit"] + [name for _, name in filesystems]
    head += [f"cairn / {names[fs]}" for fs in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in results.order:
        slot = results.figures[metric]
        if slot["unit"] in CONTEXT_UNITS | {"load"} or not wanted(slot["unit"]):
            continue
        if not any(fs in slot["values"] or fs in slot["notes"] for fs in names):
            continue  # a figure of other rows only (the thread scaling)
        row = [metric, slot["unit"] or "-"]
        row += [cell(slot, fs) for fs, _ in filesystems]
        row += [ratio(slot, "cairn", fs) for fs in others]
        lines.append("| " + " | ".join(row) + " |")
    return lines if len(lines) > 2 else []


def thread_table(results):
    """cairn threads=1 against the default worker count, one column per client count."""
    metrics = [m for m in results.order
               if any(label in results.figures[m]["values"] for label in THREAD_ROWS)]
    if not metrics:
        return []
    head = ["cairn, files/s"] + metrics
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in THREAD_ROWS:
        lines.append("| " + " | ".join([label] + [cell(results.figures[m], label)
                                                   for m in metrics]) + " |")
    ratios = [ratio(results.figures[m], THREAD_ROWS[1], THREAD_ROWS[0]) for m in metrics]
    lines.append("| " + " | ".join(["default / threads=1"] + ratios) + " |")
    return lines


def requests_tables(results):
    """Per filesystem with counted requests: requests per file of each type in each phase,
    the total, daemon time per file and the mean daemon time of the TIMED_TYPES."""
    out = []
    for fs in sorted({fs for fs, _ in results.requests}):
        phases = [p for p in PHASES if (fs, p) in results.requests]
        phases += sorted(p for f, p in results.requests if f == fs and p not in PHASES)
        runs = {phase: results.requests[(fs, phase)] for phase in phases}
        files = [", ".join(sorted({fmt(r["files"]) for r in runs[p]})) for p in phases]
        out += [f"| {fs}: requests per file | " + " | ".join(phases) + " |",
                "|" + "---|" * (len(phases) + 1),
                "| files in the phase | " + " | ".join(files) + " |"]
        for name in request_types(runs):
            count = per_file(lambda r, n=name: r["counts"].get(n, 0))
            out.append(request_row(name.upper(), runs, phases, count, fmt_small))
        total = per_file(lambda r: sum(r["counts"].values()))
        out.append(request_row("**total**", runs, phases, total, fmt_small))
        out.append(request_row(f"daemon {MICRO} per file", runs, phases,
                               lambda r: daemon_time(r, list(r["daemon_us"]), r["files"])))
        for name in TIMED_TYPES:
            out.append(request_row(f"daemon {MICRO} per {name.upper()}, mean", runs, phases,
                                   lambda r, n=name: mean_time(r, n)))
        out.append("")
    return out


def request_types(runs):
    """Every request type seen, the most frequent first."""
    totals = {}
    for records in runs.values():
        for record in records:
            for name, count in record["counts"].items():
                totals[name] = totals.get(name, 0) + count / max(1, record["files"])
    return sorted(totals, key=lambda name: (-totals[name], name))


def per_file(amount):
    return lambda record: amount(record) / max(1, record["files"])


def mean_time(record, name):
    count = record["counts"].get(name, 0)
    if not count or name not in record["daemon_us"]:
        return None
    return daemon_time(record, [name], count)


def daemon_time(record, names, per):
    """The daemon time of the request types `names` divided by `per`; None when the
    rounding of the statistics' means leaves it uncertain by more than a tenth (a few
    requests of a type of which many were counted before the phase)."""
    if not any(name in record["daemon_us"] for name in names):
        return None  # the statistics had no times
    us = sum(record["daemon_us"].get(name, 0.0) for name in names)
    error = sum(record.get("daemon_us_error", {}).get(name, 0.0) for name in names)
    if error > 0.1 * us:
        return None
    return us / max(1, per)


def request_row(label, runs, phases, value_of, show=fmt):
    cells = []
    for phase in phases:
        values = [v for v in map(value_of, runs[phase]) if v is not None]
        cells.append(spread(values, show) if values else DASH)
    return f"| {label} | " + " | ".join(cells) + " |"


def context(results):
    out = []
    for metric in results.order:
        slot = results.figures[metric]
        if slot["unit"] in CONTEXT_UNITS:
            cells = [f"{name} {cell(slot, fs)}" for fs, name in results.filesystems()]
            out.append(f"- {metric} ({slot['unit']}): " + ", ".join(cells))
    return out


def notes(results):
    out = list(results.failures)
    for metric in results.order:
        for fs, note in sorted(results.figures[metric]["notes"].items()):
            out.append(f"- {fs}, {metric}: {note}")
    return out + results.request_errors


def ascii_bars(results):
    """Each throughput figure relative to XFS, as bars of '#' (1.0 = 20 characters)."""
    if "xfs" not in results.seen:
        return []
    out = ["```", "throughput relative to XFS (#################### = 1.0)"]
    for metric in results.order:
        slot = results.figures[metric]
        if slot["unit"] not in THROUGHPUT_UNITS or not slot["values"].get("xfs"):
            continue
        out.append(metric)
        base = statistics.median(slot["values"]["xfs"])
        for fs, name in results.filesystems():
            values = slot["values"].get(fs)
            if not values or base == 0:
                continue
            rel = statistics.median(values) / base
            out.append(f"  {name:<14} {'#' * min(60, round(rel * 20)):<60} {rel:.2f}")
    out.append("```")
    return out


def ascii_histograms(histograms):
    if not histograms:
        return []
    out = ["```", "extents per file (after merging contiguous extents): files in each bucket"]
    for (prefix, fs), counts in sorted(histograms.items()):
        buckets = bucket_counts(counts)
        out.append(f"{prefix}, {fs}: " + ", ".join(f"{k}: {v}" for k, v in buckets.items() if v))
    out.append("```")
    return out


def bucket_counts(counts):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from extents import HISTOGRAM_BUCKETS, bucket

    buckets = {name: 0 for name in HISTOGRAM_BUCKETS}
    for count in counts:
        buckets[bucket(count)] += 1
    return buckets


def plot(results, img_dir):
    """Writes the PNGs that have something to show; returns (path, alt text) of each, or
    None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    os.makedirs(img_dir, exist_ok=True)
    pictures = []
    bars = plot_throughput(plt, results, os.path.join(img_dir, "bench-compare-throughput.png"))
    if bars:
        pictures.append((bars, "throughput relative to XFS"))
    hist = plot_extents(plt, results, os.path.join(img_dir, "bench-compare-extents.png"))
    if hist:
        pictures.append((hist, "extents per file"))
    return pictures


def plot_throughput(plt, results, path):
    figures, filesystems = results.figures, results.filesystems()
    metrics = [m for m in results.order if figures[m]["unit"] in THROUGHPUT_UNITS
               and figures[m]["values"].get("xfs")]
    if not metrics:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(metrics) + 1.5))
    height = 0.8 / len(filesystems)
    for i, (fs, name) in enumerate(filesystems):
        rel = []
        for metric in metrics:
            values = figures[metric]["values"].get(fs)
            base = statistics.median(figures[metric]["values"]["xfs"])
            rel.append(statistics.median(values) / base if values and base else 0)
        ax.barh([y + i * height for y in range(len(metrics))], rel, height, label=name)
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(metrics))])
    ax.set_yticklabels(metrics, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("relative to kernel XFS (median of runs, log scale; higher is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_extents(plt, results, path):
    histograms = results.histograms
    prefixes = sorted({prefix for prefix, _ in histograms})
    if not prefixes:
        return None
    fig, axes = plt.subplots(1, len(prefixes), figsize=(5 * len(prefixes), 3.5))
    axes = axes if len(prefixes) > 1 else [axes]
    for ax, prefix in zip(axes, prefixes):
        present = [(fs, name) for fs, name in results.filesystems()
                   if (prefix, fs) in histograms]
        width = 0.8 / max(1, len(present))
        for i, (fs, name) in enumerate(present):
            buckets = bucket_counts(histograms[(prefix, fs)])
            total = max(1, sum(buckets.values()))
            xs = [x + i * width for x in range(len(buckets))]
            ax.bar(xs, [100 * v / total for v in buckets.values()], width, label=name)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(buckets))])
            ax.set_xticklabels(list(buckets), fontsize=8)
        ax.set_title(f"{prefix}: extents per file", fontsize=10)
        ax.set_ylabel("% of files")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("machine")
    parser.add_argument("out")
    parser.add_argument("--img-dir", default=None, help="where PNGs go (default: none)")
    parser.add_argument("--img-base", default=None,
                        help="image links are relative to this directory (default: OUT's)")
    args = parser.parse_args(argv)
    results = load(args.results)
    names = ", ".join(name for _, name in results.filesystems())
    with open(args.machine) as machine:
        lines = [f"## Side by side: {names}", "", "```", machine.read().rstrip(), "```", ""]
    throughput = table(results, lambda unit: unit in THROUGHPUT_UNITS)
    if throughput:
        lines += ["Throughput (higher is better); median of the runs, (min-max) when they",
                  f"differ; {DASH}: not measured (see below):", ""] + throughput + [""]
    locality = table(results, lambda unit: unit not in THROUGHPUT_UNITS)
    if locality:
        lines += ["Locality (lower is better, except files in one extent); same layout:",
                  ""] + locality + [""]
    threads = thread_table(results)
    if threads:
        lines += ["cairn's worker threads: creates of empty files (then sync) from 1 and more",
                  "client processes, each in its own directories, with `-o threads=1` and with",
                  "the default worker count; fresh image each; same layout:", ""]
        lines += threads + [""]
    requests = requests_tables(results)
    if requests:
        lines += ["FUSE requests per file in each phase (`cairn stats` read right before and",
                  "after the phase; its own reads subtracted; per regular file, directories'",
                  "requests included), by type, the most frequent first; daemon time is the",
                  "time the daemon spent answering (summed over its workers), "
                  f"{DASH} where the", "rounding of the statistics leaves it uncertain by "
                  "more than 10%; same layout:", ""]
        lines += requests
    measured = context(results)
    if measured:
        lines += ["What was measured:", ""] + measured + [""]
    extra = notes(results)
    if extra:
        lines += ["Not measured:", ""] + extra + [""]
    pictures = plot(results, args.img_dir) if args.img_dir else None
    out_dir = args.img_base or os.path.dirname(os.path.abspath(args.out))
    if pictures is not None:
        for path, alt in pictures:
            lines += [f"![{alt}]({os.path.relpath(path, out_dir)})", ""]
    else:
        for block in (ascii_bars(results), ascii_histograms(results.histograms)):
            lines += block + [""] * bool(block)
    text = "\n".join(lines)
    with open(args.out, "w") as out:
        out.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
