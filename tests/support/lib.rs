//! Test support for cairn's end-to-end tests and benchmarks: temporary image files and the
//! paths of the built command-line tools.

use std::path::PathBuf;

/// Directory holding the binaries cargo built for this test run (`target/<profile>`).
pub fn binary_dir() -> PathBuf {
    let mut dir = std::env::current_exe().unwrap_or_default();
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}
