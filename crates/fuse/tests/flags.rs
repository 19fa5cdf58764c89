//! File attributes through the standard tools and a real kernel FUSE mount: chattr and
//! lsattr for every flag, the refusals of the immutable and append-only flags and what a
//! descriptor opened before them may still do, extent size hints and project ids through
//! FS_IOC_FSSETXATTR, as root and as nobody, each answer kernel XFS's (`flags/*.py` print
//! one line per check, `flags/expected*.txt` hold XFS's lines); statx as fstests'
//! generic/423 checks it, at no extra request for a plain stat; `cairn extsize`; two
//! O_DIRECT + fsync appenders under an inherited 32 MiB hint; and `cairn stats` as JSON and
//! OpenMetrics.
//!
//! To compare with XFS again: make an XFS loop mount (`losetup --direct-io=on`), run
//! `python3 battery.py MNT/r` as root, and `battery_user.py MNT/u setup 65534` as root then
//! `setpriv --reuid=65534 --regid=65534 --clear-groups python3 battery_user.py MNT/u run`,
//! and diff the outputs with the expected files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{Mount, NOBODY, Scratch, cairn_bin, fsck, python_as, run, run_as, same_answers};

const BATTERY: &str = include_str!("flags/battery.py");
const BATTERY_USER: &str = include_str!("flags/battery_user.py");
const EXPECTED: &str = include_str!("flags/expected.txt");
const EXPECTED_USER: &str = include_str!("flags/expected_user.txt");
const STATX: &str = include_str!("flags/statx.py");

const MIB: u64 = 1 << 20;

/// Runs `cairn ARGS` as `id` (root for `None`) and returns its standard output; panics with
/// its output unless it succeeds.
fn cairn_as(id: Option<u32>, args: &[&str]) -> String {
    let output = run_as(id, cairn_bin().to_str().unwrap(), args);
    let text = common::output_text(&output);
    assert!(output.status.success(), "cairn {args:?} failed:\n{text}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The requests of each type the daemon of `mount` has served.
fn request_counts(mount: &Mount) -> BTreeMap<String, u64> {
    let json = cairn_as(
        None,
        &["stats", "--json", mount.mountpoint.to_str().unwrap()],
    );
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let requests = value["fuse_requests"].as_object().unwrap();
    requests
        .iter()
        .map(|(name, counters)| (name.clone(), counters["count"].as_u64().unwrap()))
        .collect()
}

fn count(counts: &BTreeMap<String, u64>, request: &str) -> u64 {
    counts.get(request).copied().unwrap_or(0)
}

// Every flag, each refusal of i and a, earlier descriptors, directory flags, inheritance,
// hints and project ids as root; who may change what as nobody. Every answer is XFS's
// (the one documented difference is marked in expected.txt). Then fsck.
#[test]
fn flags_behave_as_on_xfs() {
    let scratch = Scratch::new();
    scratch.share();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "allow_other");
    fs::set_permissions(&mount.mountpoint, fs::Permissions::from_mode(0o1777)).unwrap();
    let (root_dir, user_dir) = (mount.path("r"), mount.path("u"));
    fs::create_dir(&root_dir).unwrap();
    fs::create_dir(&user_dir).unwrap();
    fs::set_permissions(&user_dir, fs::Permissions::from_mode(0o777)).unwrap();
    let got = python_as(None, BATTERY, &[root_dir.to_str().unwrap()]);
    same_answers("as root", EXPECTED, &got);
    let user_dir = user_dir.to_str().unwrap();
    python_as(
        None,
        BATTERY_USER,
        &[user_dir, "setup", &NOBODY.to_string()],
    );
    let got = python_as(Some(NOBODY), BATTERY_USER, &[user_dir, "run"]);
    same_answers("as nobody", EXPECTED_USER, &got);
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

// What generic/423 checks of statx (every type, birth and change times in order, the hard
// link's fields, the attribute mask), plus the birth time through `stat -c %W`. Then a cold
// remount: plain stats of many files cost no request beyond the lookups (no FUSE_STATX);
// `stat -c %W` costs one FUSE_STATX per file, and once the kernel has the birth time none.
#[test]
fn statx_as_generic_423_checks_it() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let dir = mount.path("423");
    fs::create_dir(&dir).unwrap();
    let said = python_as(None, STATX, &[dir.to_str().unwrap()]);
    assert_eq!(said.trim(), "ok");
    let files = mount.path("many");
    fs::create_dir(&files).unwrap();
    for index in 0..50 {
        fs::write(files.join(format!("f{index}")), b"x").unwrap();
    }
    mount.unmount();
    // Long timeouts: the kernel's cached attributes must not expire within the test.
    let long = "attr_timeout=3600,entry_timeout=3600";
    let mount = Mount::new(&image, &scratch.mountpoint(), long);
    let names: Vec<_> = (0..50).map(|i| files.join(format!("f{i}"))).collect();
    let paths: Vec<&str> = names.iter().map(|n| n.to_str().unwrap()).collect();
    let before = request_counts(&mount);
    // lstat(2) asks for the basic fields only (Rust's metadata asks statx for the birth
    // time too).
    let lstat = "import os, sys\nfor path in sys.argv[1:]: os.lstat(path)";
    python_as(None, lstat, &paths);
    let plain = request_counts(&mount);
    assert_eq!(count(&plain, "statx"), count(&before, "statx"), "{plain:?}");
    let lookups = count(&plain, "lookup") - count(&before, "lookup");
    let getattrs = count(&plain, "getattr") - count(&before, "getattr");
    assert!(
        lookups + getattrs <= 52,
        "{lookups} lookups, {getattrs} getattrs"
    );
    let mut args = vec!["-c", "%W"];
    args.extend(&paths);
    // One FUSE_STATX a file, then none. The kernel drops a reply that raced another
    // attribute change on the connection (its attr_version) and asks again, hence a little
    // slack; never a getattr beside it.
    let mut asked = Vec::new();
    for _ in 0..2 {
        let shown = run("stat", &args);
        let births = String::from_utf8_lossy(&shown.stdout).into_owned();
        assert!(
            births.lines().all(|l| l.parse::<u64>().unwrap() > 0),
            "{births}"
        );
        let after = request_counts(&mount);
        asked.push(count(&after, "statx") - count(&plain, "statx"));
        assert_eq!(count(&after, "getattr"), count(&plain, "getattr"));
    }
    assert!((50..=52).contains(&asked[0]), "statx requests: {asked:?}");
    assert!(asked[1] - asked[0] <= 2, "statx requests: {asked:?}");
    mount.unmount();
    assert_eq!(fsck(&image), 0);
}

/// The extent size hint `cairn extsize` prints for `path`.
fn hint_of(path: &Path) -> u64 {
    let shown = cairn_as(None, &["extsize", path.to_str().unwrap()]);
    shown
        .split("extent size hint ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no hint in {shown}"))
}

// `cairn extsize` reads and sets hints through FS_IOC_FSSETXATTR: a directory's passes to
// the files and directories made in it; a file with data keeps its hint; a size that is not
// whole blocks is refused; nobody sets hints on what they own only. The hint survives a
// remount and fsck is clean.
#[test]
fn extsize_command_sets_and_passes_on_hints() {
    let scratch = Scratch::new();
    scratch.share();
    let image = scratch.format("256M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "allow_other");
    let db = mount.path("db");
    fs::create_dir(&db).unwrap();
    assert_eq!(hint_of(&db), 0);
    let set = cairn_as(None, &["extsize", "--set", "32M", db.to_str().unwrap()]);
    assert!(
        set.contains("33554432 bytes (32.0 MiB), passed on"),
        "{set}"
    );
    fs::write(db.join("table"), b"").unwrap();
    fs::create_dir(db.join("part")).unwrap();
    fs::write(db.join("part/index"), b"").unwrap();
    for made in ["table", "part", "part/index"] {
        assert_eq!(hint_of(&db.join(made)), 32 * MIB, "{made}");
    }
    let with_data = db.join("with_data");
    fs::write(&with_data, b"data").unwrap();
    let path = with_data.to_str().unwrap();
    let refused = run(
        cairn_bin().to_str().unwrap(),
        &["extsize", "-s", "1M", path],
    );
    assert!(!refused.status.success());
    let refused = run(
        cairn_bin().to_str().unwrap(),
        &["extsize", "-s", "1000", db.join("table").to_str().unwrap()],
    );
    assert!(!refused.status.success());
    let own = mount.path("own");
    fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    cairn_as(
        Some(NOBODY),
        &["extsize", "-s", "4M", own.to_str().unwrap()],
    );
    let db_path = db.to_str().unwrap();
    let theirs = run_as(
        Some(NOBODY),
        cairn_bin().to_str().unwrap(),
        &["extsize", "-s", "0", db_path],
    );
    assert!(!theirs.status.success(), "nobody changed root's hint");
    cairn_as(
        None,
        &["extsize", "-s", "0", db.join("part").to_str().unwrap()],
    );
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    assert_eq!(hint_of(&mount.path("db")), 32 * MIB);
    assert_eq!(hint_of(&mount.path("db/part")), 0);
    assert_eq!(hint_of(&mount.path("own")), 4 * MIB);
    mount.unmount();
}

/// Appends `total` bytes to `path` in 1 MiB O_DIRECT writes, each followed by fsync.
const APPENDERS: &str = r#"
import mmap, os, sys, threading
d, mib = sys.argv[1], int(sys.argv[2])
def appender(name):
    fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    buf = mmap.mmap(-1, 1 << 20)
    buf.write(name[-1].encode() * (1 << 20))
    for index in range(mib):
        os.pwritev(fd, [buf], index << 20)
        os.fsync(fd)
    os.close(fd)
threads = [threading.Thread(target=appender, args=(n,)) for n in ("app1", "app2")]
[t.start() for t in threads]
[t.join() for t in threads]
"#;

// Two O_DIRECT + fsync appenders in a directory whose 32 MiB hint they inherit (the
// database recipe of the user guide) end with every extent at least 32 MiB long (cairn-db
// bmap after unmount), where the allocations of the two would otherwise interleave.
#[test]
fn appenders_under_an_inherited_hint_keep_long_extents() {
    let scratch = Scratch::new();
    let image = scratch.format("512M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    let db = mount.path("db");
    fs::create_dir(&db).unwrap();
    cairn_as(None, &["extsize", "-s", "32M", db.to_str().unwrap()]);
    python_as(None, APPENDERS, &[db.to_str().unwrap(), "96"]);
    let inodes: Vec<u64> = ["app1", "app2"]
        .iter()
        .map(|name| fs::metadata(db.join(name)).unwrap().ino())
        .collect();
    mount.unmount();
    assert_eq!(fsck(&image), 0);
    let device = cairn_fsck::snoop::SnoopDevice::open(&image).unwrap();
    let block_size = 4096;
    for inode in inodes {
        let command = cairn_fsck::db::DbCommand::Bmap {
            path_or_inode: inode.to_string(),
        };
        let map = cairn_fsck::db::run(&device, &command).unwrap();
        let lengths: Vec<u64> = map
            .lines()
            .skip(1)
            .filter_map(|line| line.split(") ").nth(1)?.split(' ').next()?.parse().ok())
            .collect();
        assert_eq!(lengths.iter().sum::<u64>() * block_size, 96 * MIB, "{map}");
        let short = lengths.iter().any(|&blocks| blocks * block_size < 32 * MIB);
        assert!(!short, "an extent under 32 MiB:\n{map}");
    }
}

/// Checks `text` against the OpenMetrics text format: every sample belongs to the family
/// the `# TYPE` line before it declares (counters as `_total`, info as `_info`), values
/// are numbers, a `# UNIT` matches its family's name suffix, and `# EOF` ends it. Returns
/// the samples by name and labels.
fn parse_openmetrics(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    let mut family: Option<(String, String)> = None;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no # EOF at the end");
    for line in &lines[..lines.len() - 1] {
        let words: Vec<&str> = line.splitn(4, ' ').collect();
        match words.as_slice() {
            ["#", "HELP", _name, ..] => {}
            ["#", "TYPE", name, kind] => family = Some((name.to_string(), kind.to_string())),
            ["#", "UNIT", name, unit] => assert!(name.ends_with(&format!("_{unit}")), "{line}"),
            [sample, value] => {
                let (name, _labels) = sample.split_once('{').unwrap_or((sample, ""));
                let (family, kind) = family.as_ref().unwrap_or_else(|| panic!("{line}"));
                let want = match kind.as_str() {
                    "counter" => format!("{family}_total"),
                    "info" => format!("{family}_info"),
                    _ => family.clone(),
                };
                assert_eq!(name, want, "sample outside its family: {line}");
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
                samples.insert(sample.to_string(), value);
            }
            _ => panic!("not an OpenMetrics line: {line}"),
        }
    }
    samples
}

// `cairn stats --json` and `--format openmetrics` parse, and carry the same counters as
// the text view, under the documented names and base units.
#[test]
fn stats_export_formats_parse() {
    let scratch = Scratch::new();
    let image = scratch.format("128M");
    let mount = Mount::new(&image, &scratch.mountpoint(), "");
    fs::write(mount.path("x"), vec![7u8; 300_000]).unwrap();
    let point = mount.mountpoint.to_str().unwrap();
    let json = cairn_as(None, &["stats", "--json", point]);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["format"], "cairn-stats/1");
    assert!(value["fs"]["creates"].as_u64().unwrap() >= 1, "{json}");
    assert!(value["fuse_requests"]["create"]["count"].as_u64().unwrap() >= 1);
    let text = cairn_as(None, &["stats", "--format", "openmetrics", point]);
    let samples = parse_openmetrics(&text);
    assert!(samples["cairn_fs_creates_total"] >= 1.0, "{text}");
    assert!(samples["cairn_fuse_requests_total{request=\"create\"}"] >= 1.0);
    assert!(samples.contains_key("cairn_journal_log_bytes_total"));
    assert!(samples.contains_key("cairn_write_behind_dirty_bytes"));
    assert!(samples.contains_key("cairn_uptime_seconds"));
    let plain = cairn_as(None, &["stats", point]);
    for section in [
        "fs",
        "bufcache",
        "journal",
        "alloc",
        "data",
        "extcache",
        "write_behind",
    ] {
        assert!(plain.contains(&format!("[{section}]")), "{plain}");
        let fields = value[section].as_object().unwrap();
        for name in fields.keys() {
            assert!(
                plain.contains(&format!("  {name}: ")),
                "{section}.{name} not in text"
            );
            let metric = format!("cairn_{section}_{name}");
            let exported = samples.keys().any(|k| {
                let stem = metric.trim_end_matches("_ns").trim_end_matches("_total");
                k.starts_with(stem)
            });
            assert!(exported, "{metric} not in OpenMetrics");
        }
    }
    mount.unmount();
}
