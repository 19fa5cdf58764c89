//! The daemon's writeback thread: it waits on the core's writeback signal (woken early when
//! cached file data passes a quarter of the `data_cache` cap, else once a second), then runs
//! one background pass (`Filesystem::write_back_background`), which writes back the oldest
//! files while the cache is that full or their data is a few seconds old. It holds the core
//! only during a pass, which is short, so an unmount or online grow waits little for it;
//! after a grow it waits on the new core's signal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_fs::WritebackSignal;
use parking_lot::Mutex;

use crate::core::CoreSlot;

/// The longest wait between passes.
const PASS_INTERVAL: Duration = Duration::from_secs(1);

/// The running thread; dropping it stops the thread.
#[derive(Debug)]
pub struct WritebackThread {
    stop: Arc<AtomicBool>,
    waiting_on: Arc<Mutex<Option<Arc<WritebackSignal>>>>,
    thread: Option<JoinHandle<()>>,
}

impl WritebackThread {
    /// Starts the thread, if the core caches data at all.
    pub fn spawn(core: Arc<CoreSlot>) -> Option<WritebackThread> {
        core.get().ok()?.writeback_signal()?;
        let stop = Arc::new(AtomicBool::new(false));
        let waiting_on = Arc::new(Mutex::new(None));
        let (stop_flag, current) = (Arc::clone(&stop), Arc::clone(&waiting_on));
        let thread = std::thread::Builder::new()
            .name("cairn-writeback".into())
            .spawn(move || run(&core, &stop_flag, &current));
        let thread = match thread {
            Ok(thread) => thread,
            Err(error) => {
                tracing::error!(
                    %error,
                    "no writeback thread: cached data is written back by writers and fsync only"
                );
                return None;
            }
        };
        Some(WritebackThread {
            stop,
            waiting_on,
            thread: Some(thread),
        })
    }
}

fn run(core: &CoreSlot, stop: &AtomicBool, waiting_on: &Mutex<Option<Arc<WritebackSignal>>>) {
    while !stop.load(Ordering::Acquire) {
        let Some(signal) = core.get().ok().and_then(|fs| fs.writeback_signal()) else {
            return;
        };
        *waiting_on.lock() = Some(Arc::clone(&signal));
        if stop.load(Ordering::Acquire) {
            return;
        }
        signal.wait(PASS_INTERVAL);
        match core.get() {
            Ok(fs) => fs.write_back_background(),
            Err(_) => return,
        }
    }
}

impl Drop for WritebackThread {
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
