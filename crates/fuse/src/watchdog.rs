//! The hang watchdog: a thread that looks at the requests in flight once a second and logs,
//! at warning level, every request older than `STUCK_AFTER` (once each) with its type and
//! node, and what each of the daemon's threads is waiting in. Builds with the
//! `deadlock-detection` feature (test builds) also check parking_lot's lock graph and log
//! every cycle with the stacks of its threads at error level. `cairn stats` shows the oldest
//! request in flight, so a hang is visible at once without the log.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stats::RequestStats;

/// A request in flight this long is reported as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);
/// How often the watchdog looks.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// The running watchdog; dropping it stops the thread.
#[derive(Debug)]
pub struct Watchdog {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `requests`; `describe` adds the filesystem's state (the log's space)
    /// to a report of stuck requests.
    pub fn spawn(requests: Arc<RequestStats>, describe: Describe) -> Watchdog {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cairn-watchdog".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(SCAN_INTERVAL) {
                    scan(&requests, &describe);
                }
            });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::error!(%error, "no watchdog thread: hung requests will not be logged");
                None
            }
        };
        Watchdog {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the watchdog adds to a report of stuck requests.
pub type Describe = Box<dyn Fn() -> String + Send>;

/// One look: stuck requests (each reported once) and lock cycles.
fn scan(requests: &RequestStats, describe: &Describe) {
    let stuck = requests.take_unreported_older_than(STUCK_AFTER);
    for request in &stuck {
        tracing::warn!(
            request = request.name,
            node = request.node,
            secs = request.age.as_secs(),
            "request in flight for more than {} s",
            STUCK_AFTER.as_secs()
        );
    }
    if !stuck.is_empty() {
        tracing::warn!(threads = %thread_states(), "daemon threads (name: state, wait channel)");
        tracing::warn!(log = %describe(), "log space");
    }
    for cycle in cairn_lockrank::lock_cycles() {
        tracing::error!("{cycle}");
    }
}

/// Every thread of this process as `name: state wchan`, from /proc (what the kernel says
/// each waits in: a futex for a lock, the FUSE device for a new request).
fn thread_states() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return "unknown (no /proc/self/task)".into();
    };
    let mut states: Vec<String> = tasks
        .flatten()
        .map(|task| {
            let read = |name: &str| {
                std::fs::read_to_string(task.path().join(name))
                    .map(|text| text.trim().to_string())
                    .unwrap_or_default()
            };
            let stat = read("stat");
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or("?")
                .to_string();
            format!("{}: {state} {}", read("comm"), read("wchan"))
        })
        .collect();
    states.sort();
    states.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every thread of the process is listed with a state.
    #[test]
    fn thread_states_list_this_thread() {
        let states = thread_states();
        assert!(!states.is_empty());
        assert!(states.contains(':'), "{states}");
    }
}
