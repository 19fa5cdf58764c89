//! Tidy checks over the whole source tree: line length, ASCII, every on-disk type sized and
//! round-trip tested, and errno values only where the conventions allow them.

use std::fs;
use std::path::{Path, PathBuf};

const LINE_COLUMNS_MAX: usize = 100;
const SOURCE_DIRS: [&str; 4] = ["crates", "tests", "benches", "tools"];
/// Crates that talk to the kernel and may name errno values.
const ERRNO_ALLOWED: [&str; 2] = ["crates/blockdev/", "crates/fuse/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = SOURCE_DIRS.iter().map(|d| root().join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

// Every source line is ASCII and at most 100 columns.
#[test]
fn lines_are_short_and_ascii() {
    let mut bad = Vec::new();
    for file in rust_files() {
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            if !line.is_ascii() {
                bad.push(format!("{}:{}: non-ASCII", relative(&file), number + 1));
            }
            if line.chars().count() > LINE_COLUMNS_MAX {
                bad.push(format!(
                    "{}:{}: longer than 100 columns",
                    relative(&file),
                    number + 1
                ));
            }
        }
    }
    assert!(bad.is_empty(), "tidy failures:\n{}", bad.join("\n"));
}

/// Names of the types that implement `OnDisk` in the format crate.
fn on_disk_types(format_sources: &str) -> Vec<String> {
    format_sources
        .lines()
        .filter_map(|line| line.trim().strip_prefix("impl OnDisk for "))
        .map(|rest| rest.trim_end_matches(" {").trim().to_string())
        .collect()
}

// Every OnDisk type has a compile-time size assert in sizes.rs and a round-trip test.
#[test]
fn on_disk_types_are_sized_and_round_trip_tested() {
    let src = root().join("crates/format/src");
    let sources: String = rust_files()
        .iter()
        .filter(|p| p.starts_with(&src))
        .map(|p| fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let sizes = fs::read_to_string(src.join("sizes.rs")).unwrap_or_default();
    let round_trips: Vec<&str> = sources
        .split("fn ")
        .filter(|f| f.contains("round_trip"))
        .collect();
    let types = on_disk_types(&sources);
    assert!(
        types.len() >= 10,
        "expected the format crate's OnDisk types, found {types:?}"
    );
    let mut missing = Vec::new();
    for name in &types {
        if !sizes.contains(&format!("{name}::SIZE")) {
            missing.push(format!("{name}: no size assert in sizes.rs"));
        }
        if !round_trips.iter().any(|body| body.contains(name.as_str())) {
            missing.push(format!("{name}: no round_trip test mentions it"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

// Errno values appear only in the crates that talk to the kernel.
#[test]
fn errno_only_where_allowed() {
    let mut bad = Vec::new();
    for file in rust_files() {
        let name = relative(&file);
        if ERRNO_ALLOWED.iter().any(|p| name.starts_with(p)) || name.ends_with("tidy.rs") {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let errno = line
                .split("libc::E")
                .skip(1)
                .any(|rest| rest.chars().next().is_some_and(|c| c.is_ascii_uppercase()));
            if errno {
                bad.push(format!(
                    "{name}:{}: errno outside blockdev/fuse",
                    number + 1
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
