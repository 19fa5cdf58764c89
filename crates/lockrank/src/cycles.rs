//! Lock cycles, as parking_lot's detector sees them (with the `deadlock-detection` feature).

/// Whether this build carries the cycle detector.
pub const DETECTOR_ENABLED: bool = cfg!(feature = "deadlock-detection");

/// The lock cycles among parking_lot's mutexes and rwlocks right now (buffer, inode, AG and
/// journal locks are all of them), one report per cycle naming each thread and its stack
/// when it blocked. Empty without the detector. Each cycle is reported once.
pub fn lock_cycles() -> Vec<String> {
    #[cfg(feature = "deadlock-detection")]
    {
        parking_lot::deadlock::check_deadlock()
            .iter()
            .enumerate()
            .map(|(number, threads)| {
                let mut report = format!("lock cycle {number}: {} threads", threads.len());
                for thread in threads {
                    report.push_str(&format!(
                        "\n-- thread {:?}\n{:?}",
                        thread.thread_id(),
                        thread.backtrace()
                    ));
                }
                report
            })
            .collect()
    }
    #[cfg(not(feature = "deadlock-detection"))]
    Vec::new()
}
