//! The daemon's background thread: it attaches to the core (`Filesystem::attach_background`)
//! and waits on its signal (woken early when cached file data passes a quarter of the
//! `data_cache` cap or a request hands over an inode reclaim pass, else after a quarter of
//! the commit window, a second at most), then runs one pass (`Filesystem::background_pass`):
//! writeback of the oldest cached files while the cache is that full, the commit window's
//! writeback and log force (`-o commit=`), and the reclaim pass if one was handed over.
//! Requests so never wait for any of it. It holds the core only during a pass, which is
//! short, so an unmount or online grow waits little for it; after a grow it attaches to the
//! new core.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use cairn_fs::BackgroundSignal;
use parking_lot::Mutex;

use crate::core::CoreSlot;

/// The running thread; dropping it stops the thread.
#[derive(Debug)]
pub struct BackgroundThread {
    stop: Arc<AtomicBool>,
    waiting_on: Arc<Mutex<Option<Arc<BackgroundSignal>>>>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundThread {
    /// Starts the thread; without it (the system refused a thread) requests reclaim inodes
    /// themselves and cached data is written back by writers and `fsync` only.
    pub fn spawn(core: Arc<CoreSlot>) -> Option<BackgroundThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let waiting_on = Arc::new(Mutex::new(None));
        let (stop_flag, current) = (Arc::clone(&stop), Arc::clone(&waiting_on));
        let thread = std::thread::Builder::new()
            .name("cairn-background".into())
            .spawn(move || run(&core, &stop_flag, &current));
        let thread = match thread {
            Ok(thread) => thread,
            Err(error) => {
                tracing::error!(
                    %error,
                    "no background thread: cached data is written back by writers and fsync only"
                );
                return None;
            }
        };
        Some(BackgroundThread {
            stop,
            waiting_on,
            thread: Some(thread),
        })
    }
}

fn run(core: &CoreSlot, stop: &AtomicBool, waiting_on: &Mutex<Option<Arc<BackgroundSignal>>>) {
    while !stop.load(Ordering::Acquire) {
        // The commit window sets the longest wait between passes (a quarter of it, 1 s at
        // most), so data and metadata are durable within the window without an fsync.
        let Some((signal, interval)) = core
            .get()
            .ok()
            .map(|fs| (fs.attach_background(), fs.background_interval()))
        else {
            return;
        };
        *waiting_on.lock() = Some(Arc::clone(&signal));
        if stop.load(Ordering::Acquire) {
            break;
        }
        signal.wait(interval);
        match core.get() {
            Ok(fs) => fs.background_pass(),
            Err(_) => return,
        }
    }
    if let Ok(fs) = core.get() {
        fs.detach_background();
    }
}

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(signal) = self.waiting_on.lock().as_ref() {
            signal.wake();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
