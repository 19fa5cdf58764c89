//! Test support shared by cairn's crates' end-to-end tests: reading a command's output and
//! holding an image locked from another process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Standard output then standard error of a finished command, as text.
pub fn output_text(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    format!("{stdout}{stderr}")
}

/// Another process holding a POSIX write lock on a file, as a running cairn daemon or mkfs
/// would. The lock is held from `new` returning until drop.
#[derive(Debug)]
pub struct LockHolder {
    child: Child,
}

impl LockHolder {
    /// Starts a python3 process that write-locks `path` and waits until it holds the lock.
    pub fn new(path: &Path) -> LockHolder {
        let script = "import fcntl,sys,time\nf=open(sys.argv[1],'r+b')\n\
                      fcntl.lockf(f,fcntl.LOCK_EX)\nprint('locked',flush=True)\ntime.sleep(60)";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(path)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 is needed by this test");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked", "the lock holder did not start");
        LockHolder { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
