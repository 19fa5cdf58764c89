//! Per-thread CPU time, to tell a scan's own work apart from time it spent preempted.

/// CPU time consumed by the calling thread, in nanoseconds (0 if the clock is unavailable).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec owned by this frame; clock_gettime writes
    // only into it and has no other preconditions.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if result != 0 {
        return 0;
    }
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanoseconds = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds
        .saturating_mul(1_000_000_000)
        .saturating_add(nanoseconds)
}
