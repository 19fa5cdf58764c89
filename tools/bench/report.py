#!/usr/bin/env python3
"""Turns tools/bench-compare's results into Markdown tables (median and min-max of the runs,
ratios of cairn to XFS and to fuse2fs) and, where matplotlib imports, PNG plots.

  report.py RESULTS.jsonl MACHINE.txt OUT.md [--img-dir DIR]

RESULTS.jsonl holds one JSON object a line: {"fs", "run", "metric", "value", "unit"} for a
figure, {"fs", "run", "extent_counts": {"prefix", "counts"}} for a histogram. A value of null
is a figure the filesystem cannot give; its unit says why ("n/a: ...").
"""

import argparse
import json
import os
import statistics
import sys

FILESYSTEMS = [("cairn", "cairn"), ("xfs", "XFS"), ("ext4", "ext4"), ("fuse2fs", "fuse2fs")]
THROUGHPUT_UNITS = {"files/s", "MiB/s", "entries/s", "IOPS", "writes/s"}
# Figures that describe what was measured rather than how well: listed apart, no ratios.
CONTEXT_UNITS = {"files", "entries", "% used"}


def load(path):
    figures, histograms = {}, {}
    order = []
    with open(path) as results:
        for line in results:
            line = line.strip()
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "extent_counts" in record:
                entry = record["extent_counts"]
                key = (entry["prefix"], record["fs"])
                histograms.setdefault(key, []).extend(entry["counts"])
                continue
            if "metric" not in record:
                continue
            metric = record["metric"]
            if metric not in figures:
                figures[metric] = {"unit": None, "values": {}, "notes": {}}
                order.append(metric)
            slot = figures[metric]
            if record["value"] is None:
                slot["notes"][record["fs"]] = record["unit"]
            else:
                slot["unit"] = record["unit"]
                slot["values"].setdefault(record["fs"], []).append(record["value"])
    return order, figures, histograms


def fmt(value):
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value):,}"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(slot, fs):
    values = slot["values"].get(fs)
    if not values:
        note = slot["notes"].get(fs, "n/a: not run")
        return note.split(":")[0] if note.startswith("n/a") else note
    text = fmt(statistics.median(values))
    if len(values) > 1 and min(values) != max(values):
        text += f" ({fmt(min(values))}-{fmt(max(values))})"
    return text


def ratio(slot, fs, other):
    mine, theirs = slot["values"].get(fs), slot["values"].get(other)
    if not mine or not theirs:
        return "-"
    denominator = statistics.median(theirs)
    if denominator == 0:
        return "-"
    value = statistics.median(mine) / denominator
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def table(order, figures, wanted):
    head = ["workload", "unit"] + [name for _, name in FILESYSTEMS]
    head += ["cairn / XFS", "cairn / fuse2fs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in order:
        slot = figures[metric]
        if slot["unit"] in CONTEXT_UNITS | {"load"} or not wanted(slot["unit"]):
            continue
        row = [metric, slot["unit"] or "-"]
        row += [cell(slot, fs) for fs, _ in FILESYSTEMS]
        row += [ratio(slot, "cairn", "xfs"), ratio(slot, "cairn", "fuse2fs")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def context(order, figures):
    out = []
    for metric in order:
        slot = figures[metric]
        if slot["unit"] in CONTEXT_UNITS:
            cells = [f"{name} {cell(slot, fs)}" for fs, name in FILESYSTEMS]
            out.append(f"- {metric} ({slot['unit']}): " + ", ".join(cells))
    return out


def notes(order, figures):
    out = []
    for metric in order:
        for fs, note in sorted(figures[metric]["notes"].items()):
            out.append(f"- {fs}, {metric}: {note}")
    return out


def ascii_bars(order, figures):
    """Each throughput figure relative to XFS, as bars of '#' (1.0 = 20 characters)."""
    out = ["```", "throughput relative to XFS (#################### = 1.0)"]
    for metric in order:
        slot = figures[metric]
        if slot["unit"] not in THROUGHPUT_UNITS or not slot["values"].get("xfs"):
            continue
        out.append(metric)
        base = statistics.median(slot["values"]["xfs"])
        for fs, name in FILESYSTEMS:
            values = slot["values"].get(fs)
            if not values or base == 0:
                continue
            rel = statistics.median(values) / base
            out.append(f"  {name:<8} {'#' * min(60, round(rel * 20)):<60} {rel:.2f}")
    out.append("```")
    return out


def ascii_histograms(histograms):
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


def plot(order, figures, histograms, img_dir):
    """Writes the two PNGs; returns their paths, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    os.makedirs(img_dir, exist_ok=True)
    metrics = [m for m in order if figures[m]["unit"] in THROUGHPUT_UNITS
               and figures[m]["values"].get("xfs")]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(metrics) + 1.5))
    height = 0.8 / len(FILESYSTEMS)
    for i, (fs, name) in enumerate(FILESYSTEMS):
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
    bars = os.path.join(img_dir, "bench-compare-throughput.png")
    fig.savefig(bars, dpi=90)
    plt.close(fig)
    prefixes = sorted({prefix for prefix, _ in histograms})
    fig, axes = plt.subplots(1, max(1, len(prefixes)), figsize=(5 * max(1, len(prefixes)), 3.5))
    axes = axes if len(prefixes) > 1 else [axes]
    for ax, prefix in zip(axes, prefixes):
        present = [(fs, name) for fs, name in FILESYSTEMS if (prefix, fs) in histograms]
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
    hist = os.path.join(img_dir, "bench-compare-extents.png")
    fig.savefig(hist, dpi=90)
    plt.close(fig)
    return bars, hist


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("machine")
    parser.add_argument("out")
    parser.add_argument("--img-dir", default=None, help="where PNGs go (default: none)")
    parser.add_argument("--img-base", default=None,
                        help="image links are relative to this directory (default: OUT's)")
    args = parser.parse_args(argv)
    order, figures, histograms = load(args.results)
    with open(args.machine) as machine:
        lines = ["## Side by side: cairn, XFS, ext4, fuse2fs", "", "```", machine.read().rstrip(),
                 "```", ""]
    lines += ["Throughput (higher is better); median of the runs, (min-max) when they differ:", "",
              table(order, figures, lambda unit: unit in THROUGHPUT_UNITS), ""]
    lines += ["Locality (lower is better, except files in one extent); same layout:", "",
              table(order, figures, lambda unit: unit not in THROUGHPUT_UNITS), ""]
    lines += ["What was measured:", ""] + context(order, figures) + [""]
    extra = notes(order, figures)
    if extra:
        lines += ["Not measured:", ""] + extra + [""]
    pictures = plot(order, figures, histograms, args.img_dir) if args.img_dir else None
    out_dir = args.img_base or os.path.dirname(os.path.abspath(args.out))
    if pictures:
        for path, alt in zip(pictures, ["throughput relative to XFS", "extents per file"]):
            lines += [f"![{alt}]({os.path.relpath(path, out_dir)})", ""]
    else:
        lines += ascii_bars(order, figures) + [""] + ascii_histograms(histograms) + [""]
    text = "\n".join(lines)
    with open(args.out, "w") as out:
        out.write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
