//! Injected faults for `MemDevice`: the decision of whether one operation fails, kept apart from
//! the device so the rules can be read (and tested) in one place.

use std::ops::Range;

use crate::DeviceError;

/// Counters of a `MemDevice`: operations that succeeded and faults that fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    /// Reads refused by `fail_reads_in`.
    pub read_faults: u64,
    /// Writes refused by `fail_writes_in` or `fail_nth_write`.
    pub write_faults: u64,
    /// Flushes refused by `fail_flushes`.
    pub flush_faults: u64,
    /// Writes, discards and flushes refused because the device had stopped.
    pub stopped_refusals: u64,
}

/// The faults armed on a device. Every rule is checked before the medium is touched, so a failed
/// operation never changes the image.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    read_ranges: Vec<Range<u64>>,
    write_ranges: Vec<Range<u64>>,
    /// Fail the write whose 1-based attempt number (counted over the device's life) is this.
    fail_write_number: Option<u64>,
    write_attempts: u64,
    /// Writes still accepted before the device stops; `None` when no stop is armed.
    writes_before_stop: Option<u64>,
    stopped: bool,
    flushes_to_fail: u64,
    pub(crate) stats: MemStats,
}

fn overlaps(ranges: &[Range<u64>], offset: u64, len: u64) -> bool {
    let end = offset.saturating_add(len.max(1));
    ranges
        .iter()
        .any(|range| range.start < end && offset < range.end)
}

impl Faults {
    pub(crate) fn fail_reads_in(&mut self, range: Range<u64>) {
        self.read_ranges.push(range);
    }

    pub(crate) fn fail_writes_in(&mut self, range: Range<u64>) {
        self.write_ranges.push(range);
    }

    pub(crate) fn fail_nth_write(&mut self, n: u64) {
        self.fail_write_number = Some(self.write_attempts.saturating_add(n.max(1)));
    }

    pub(crate) fn stop_after_writes(&mut self, n: u64) {
        self.writes_before_stop = Some(n);
        self.stopped = n == 0;
    }

    pub(crate) fn fail_flushes(&mut self, n: u64) {
        self.flushes_to_fail = n;
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Disarms every fault and restarts a stopped device; the counters are kept.
    pub(crate) fn clear(&mut self) {
        let stats = self.stats;
        let write_attempts = self.write_attempts;
        *self = Self {
            stats,
            write_attempts,
            ..Self::default()
        };
    }

    pub(crate) fn check_read(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if overlaps(&self.read_ranges, offset, len) {
            self.stats.read_faults += 1;
            return Err(DeviceError::Injected { op: "read", offset });
        }
        self.stats.reads += 1;
        Ok(())
    }

    /// Decides a write. On `Ok` the caller must apply it.
    pub(crate) fn check_write(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.admit_write(offset, len)?;
        self.stats.writes += 1;
        Ok(())
    }

    /// Decides a discard, which writes zeros and so obeys every write rule.
    pub(crate) fn check_discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.admit_write(offset, len)?;
        self.stats.discards += 1;
        Ok(())
    }

    fn admit_write(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if self.stopped {
            self.stats.stopped_refusals += 1;
            return Err(DeviceError::Stopped);
        }
        self.write_attempts += 1;
        if self.fail_write_number == Some(self.write_attempts)
            || overlaps(&self.write_ranges, offset, len)
        {
            self.stats.write_faults += 1;
            return Err(DeviceError::Injected {
                op: "write",
                offset,
            });
        }
        match self.writes_before_stop {
            Some(0) => {
                self.stopped = true;
                self.stats.stopped_refusals += 1;
                return Err(DeviceError::Stopped);
            }
            Some(left) => self.writes_before_stop = Some(left - 1),
            None => {}
        }
        Ok(())
    }

    pub(crate) fn check_flush(&mut self) -> Result<(), DeviceError> {
        if self.stopped {
            self.stats.stopped_refusals += 1;
            return Err(DeviceError::Stopped);
        }
        if self.flushes_to_fail > 0 {
            self.flushes_to_fail -= 1;
            self.stats.flush_faults += 1;
            return Err(DeviceError::Injected {
                op: "flush",
                offset: 0,
            });
        }
        self.stats.flushes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the Nth write fails once and that the stop rule refuses later writes/flushes.
    #[test]
    fn nth_write_and_stop() {
        let mut faults = Faults::default();
        faults.fail_nth_write(2);
        assert!(faults.check_write(0, 512).is_ok());
        assert!(matches!(
            faults.check_write(0, 512),
            Err(DeviceError::Injected { .. })
        ));
        assert!(faults.check_write(0, 512).is_ok());
        faults.stop_after_writes(1);
        assert!(faults.check_write(0, 512).is_ok());
        assert!(matches!(
            faults.check_write(0, 512),
            Err(DeviceError::Stopped)
        ));
        assert!(matches!(faults.check_flush(), Err(DeviceError::Stopped)));
        assert!(faults.is_stopped());
        faults.clear();
        assert!(faults.check_flush().is_ok());
        assert_eq!(faults.stats.write_faults, 1);
        assert_eq!(faults.stats.stopped_refusals, 2);
        assert_eq!(faults.stats.writes, 3);
    }

    // Checks range overlap for reads and writes, including the half-open end.
    #[test]
    fn ranges_overlap_half_open() {
        let mut faults = Faults::default();
        faults.fail_reads_in(4096..8192);
        faults.fail_writes_in(0..512);
        assert!(faults.check_read(0, 4096).is_ok());
        assert!(faults.check_read(8192, 4096).is_ok());
        assert!(faults.check_read(4096, 512).is_err());
        assert!(faults.check_read(0, 8192).is_err());
        assert!(faults.check_write(512, 512).is_ok());
        assert!(faults.check_write(0, 4096).is_err());
        faults.fail_flushes(1);
        assert!(faults.check_flush().is_err());
        assert!(faults.check_flush().is_ok());
        assert_eq!(faults.stats.read_faults, 2);
        assert_eq!(faults.stats.flush_faults, 1);
    }
}
