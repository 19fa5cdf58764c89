//! The shrinker thread's sleep and the writers' wake-up call, generic over the flag so the
//! loom model below runs this code on loom's atomics.
//!
//! The shrinker announces that it goes to sleep, then looks at the cache's size once more;
//! a writer that took the cache above the high watermark takes the announcement and unparks
//! it. Both sides change the one flag with a read-modify-write, so whichever comes second in
//! the flag's order reads what the other wrote: either the writer finds the announcement (and
//! wakes the shrinker), or the shrinker's swap reads the writer's, which releases the growth
//! to it, and its second look sees the cache above the mark (and it does not sleep).
//!
//! The announcement used to be a plain release store. A store acquires nothing, so the
//! shrinker's second look could miss a growth whose writer had already found no announcement
//! (the store-buffering pattern, which x86 allows too): the shrinker then slept through the
//! growth until its idle timeout or the next edit. The model found that.

use std::sync::atomic::{AtomicBool, Ordering};

use cairn_atomic::AtomicFlag;

/// Whether the shrinker has announced that it sleeps.
#[derive(Debug)]
pub(crate) struct SleepAnnouncement<F = AtomicBool> {
    sleeping: F,
}

impl<F: AtomicFlag> SleepAnnouncement<F> {
    pub(crate) fn new() -> Self {
        Self {
            sleeping: F::new(false),
        }
    }

    /// The shrinker, before parking: announces the sleep, then asks `needed` (is the cache
    /// above the high watermark?). True if it may park; false, with the announcement taken
    /// back, if it is needed.
    pub(crate) fn announce(&self, needed: impl FnOnce() -> bool) -> bool {
        self.sleeping.swap(true, Ordering::AcqRel);
        if needed() {
            self.sleeping.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// The shrinker, awake again.
    pub(crate) fn woke(&self) {
        self.sleeping.store(false, Ordering::Release);
    }

    /// A writer that found the cache above the high watermark: true if the shrinker had
    /// announced a sleep (the caller unparks it). The release hands the writer's growth to
    /// the shrinker's announcement if that comes after.
    pub(crate) fn take(&self) -> bool {
        self.sleeping.swap(false, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod models {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use loom::sync::atomic::{AtomicBool as LoomFlag, AtomicU64 as LoomWord};

    use super::SleepAnnouncement;

    const HIGH: u64 = 100;

    // A writer takes the cache above the high watermark (an atomic add, as `Stats::adjust`,
    // then `note_growth`'s look and take) while the shrinker announces its sleep and looks
    // again: the shrinker never parks without being woken.
    #[test]
    fn growth_wakes_a_sleeping_shrinker() {
        loom::model(|| {
            let announcement = Arc::new(SleepAnnouncement::<LoomFlag>::new());
            let objects = Arc::new(LoomWord::new(HIGH));
            let writer = {
                let (announcement, objects) = (Arc::clone(&announcement), Arc::clone(&objects));
                loom::thread::spawn(move || {
                    objects.fetch_add(1, Ordering::Relaxed);
                    objects.load(Ordering::Relaxed) > HIGH && announcement.take()
                })
            };
            let parks = announcement.announce(|| objects.load(Ordering::Relaxed) > HIGH);
            let woken = writer.join().unwrap();
            assert!(!parks || woken, "the shrinker sleeps through the growth");
            if parks {
                announcement.woke();
            }
        });
    }
}
