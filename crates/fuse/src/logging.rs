//! `tracing` output: stderr in the foreground; syslog (facility daemon) or a file in the
//! background. `RUST_LOG` sets the level (default `info`: mounts, unmounts, recovery and
//! errors; nothing per request). fuser's own `log` records are forwarded as well.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Where log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    Syslog,
    File(PathBuf),
}

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Installs the global subscriber for `target`. A second call does nothing.
pub fn init(target: &LogTarget) -> io::Result<()> {
    let builder = tracing_subscriber::fmt().with_env_filter(filter());
    let result = match target {
        LogTarget::Stderr => builder
            .with_ansi(io::stderr().is_terminal())
            .with_writer(io::stderr)
            .try_init(),
        LogTarget::Syslog => {
            open_syslog();
            builder
                .with_ansi(false)
                .without_time()
                .with_writer(SyslogWriter)
                .try_init()
        }
        LogTarget::File(path) => {
            let file = OpenOptions::new().create(true).append(true).open(path)?;
            builder
                .with_ansi(false)
                .with_writer(Mutex::new(file))
                .try_init()
        }
    };
    // An error here means a subscriber is installed already (tests call this twice).
    let _ = result;
    Ok(())
}

fn open_syslog() {
    static IDENT: &[u8] = b"cairn\0";
    // SAFETY: IDENT is a NUL-terminated static string, which openlog may keep a pointer to.
    unsafe { libc::openlog(IDENT.as_ptr().cast(), libc::LOG_PID, libc::LOG_DAEMON) };
}

/// Hands each formatted event to syslog(3) with the priority of its level.
#[derive(Debug, Clone, Copy)]
struct SyslogWriter;

/// One event's text, sent when dropped.
#[derive(Debug)]
pub struct SyslogLine {
    priority: libc::c_int,
    text: Vec<u8>,
}

fn priority(level: &Level) -> libc::c_int {
    match *level {
        Level::ERROR => libc::LOG_ERR,
        Level::WARN => libc::LOG_WARNING,
        Level::INFO => libc::LOG_INFO,
        _ => libc::LOG_DEBUG,
    }
}

impl<'a> MakeWriter<'a> for SyslogWriter {
    type Writer = SyslogLine;

    fn make_writer(&'a self) -> SyslogLine {
        SyslogLine {
            priority: libc::LOG_INFO,
            text: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> SyslogLine {
        SyslogLine {
            priority: priority(meta.level()),
            text: Vec::new(),
        }
    }
}

impl Write for SyslogLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for SyslogLine {
    fn drop(&mut self) {
        let text: Vec<u8> = self.text.iter().copied().filter(|&b| b != 0).collect();
        let text = String::from_utf8_lossy(&text);
        let Ok(message) = CString::new(text.trim_end()) else {
            return;
        };
        static FORMAT: &[u8] = b"%s\0";
        // SAFETY: both pointers are NUL-terminated strings that outlive the call; "%s"
        // makes syslog read exactly one string argument.
        unsafe { libc::syslog(self.priority, FORMAT.as_ptr().cast(), message.as_ptr()) };
    }
}
