//! An in-memory `BlockDevice` for tests: live image, durable image, op log, crash images and
//! injected faults.
//!
//! Crash semantics (the `BlockDevice` ordering contract, made explicit):
//! - the *live* image holds every completed write; reads see it;
//! - the *durable* image holds the writes completed before the last successful flush; it is what
//!   a crash that loses the whole volatile cache leaves;
//! - while recording, every completed write (with its data) and flush is appended to the op log.
//!   A crash image replays a prefix of the log on the log's base image, keeping every write
//!   before the chosen flush and a chosen subset of the writes after it, optionally with one
//!   write torn at sector granularity (see [`crate::crash`] and [`CrashPoint`]);
//! - the log's base is the durable image at the moment recording started or the log was
//!   cleared, and the writes not yet flushed at that moment open the log, so crash images are
//!   exact whenever recording is switched on;
//! - a refused operation (bad range, read-only, injected fault, stopped) changes nothing.

use std::ops::Range;

use parking_lot::Mutex;

use crate::crash::{self, CrashPoint, LogOp, WriteExtent};
use crate::fault::{Faults, MemStats};
use crate::{AlignedBuf, BUFFER_ALIGN, BlockDevice, DeviceError, check_transfer};

/// Everything behind the device's one lock; no operation holds it across anything slow.
#[derive(Debug)]
struct MemState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes completed since the last successful flush, oldest first.
    pending: Vec<(u64, Vec<u8>)>,
    recording: bool,
    log_base: Vec<u8>,
    log: Vec<LogOp>,
    faults: Faults,
    read_only: bool,
}

/// An in-memory block device; see the module documentation for its crash semantics.
#[derive(Debug)]
pub struct MemDevice {
    size_bytes: u64,
    sector_size: u32,
    state: Mutex<MemState>,
}

/// Checks that `sector_size` is a power of two in `512..=BUFFER_ALIGN` and `size_bytes` a
/// multiple of it that fits in memory.
pub(crate) fn check_geometry(size_bytes: u64, sector_size: u32) -> Result<(), DeviceError> {
    let sector_ok =
        sector_size.is_power_of_two() && (512..=BUFFER_ALIGN as u32).contains(&sector_size);
    if !sector_ok {
        return Err(DeviceError::Geometry {
            reason: format!("sector size {sector_size} is not a power of two in 512..=4096"),
        });
    }
    if !size_bytes.is_multiple_of(u64::from(sector_size)) {
        return Err(DeviceError::Geometry {
            reason: format!("size {size_bytes} is not a multiple of the {sector_size}-byte sector"),
        });
    }
    Ok(())
}

fn to_index(value: u64) -> usize {
    // Offsets were checked against the image size, which is a `Vec` length.
    usize::try_from(value).unwrap_or(usize::MAX)
}

impl MemDevice {
    /// A zeroed device of `size_bytes` with `sector_size`-byte sectors, recording on.
    ///
    /// # Panics
    /// When the geometry is invalid (see [`MemDevice::try_new`]); the arguments are constants
    /// in tests, so a wrong one is a bug in the test.
    #[expect(
        clippy::panic,
        reason = "test-only constructor; documented panic on bad geometry"
    )]
    pub fn new(size_bytes: u64, sector_size: u32) -> Self {
        match Self::try_new(size_bytes, sector_size) {
            Ok(device) => device,
            Err(error) => panic!("MemDevice::new({size_bytes}, {sector_size}): {error}"),
        }
    }

    /// A zeroed device, or `Geometry` when `sector_size` is not a power of two in 512..=4096,
    /// `size_bytes` is not a multiple of it, or the image would not fit in memory.
    pub fn try_new(size_bytes: u64, sector_size: u32) -> Result<Self, DeviceError> {
        check_geometry(size_bytes, sector_size)?;
        let len = usize::try_from(size_bytes).map_err(|_| DeviceError::Geometry {
            reason: format!("size {size_bytes} does not fit in memory"),
        })?;
        // `vec!` of zeros is a lazily mapped allocation, so large sparse devices are cheap.
        Ok(Self::build(
            vec![0; len],
            vec![0; len],
            vec![0; len],
            sector_size,
        ))
    }

    /// A device holding `bytes`, or `Geometry` as for [`MemDevice::try_new`].
    pub fn from_image(bytes: Vec<u8>, sector_size: u32) -> Result<Self, DeviceError> {
        check_geometry(bytes.len() as u64, sector_size)?;
        let durable = bytes.clone();
        let base = bytes.clone();
        Ok(Self::build(bytes, durable, base, sector_size))
    }

    fn build(live: Vec<u8>, durable: Vec<u8>, log_base: Vec<u8>, sector_size: u32) -> Self {
        Self {
            size_bytes: live.len() as u64,
            sector_size,
            state: Mutex::new(MemState {
                live,
                durable,
                pending: Vec::new(),
                recording: true,
                log_base,
                log: Vec::new(),
                faults: Faults::default(),
                read_only: false,
            }),
        }
    }

    /// Makes the device refuse (or accept again) writes and discards with `ReadOnly`.
    pub fn set_read_only(&self, read_only: bool) {
        self.state.lock().read_only = read_only;
    }

    /// Switches the op log on or off. Switching it on starts a fresh log whose base is the
    /// durable image and whose first entries are the writes not yet flushed. Switching it off
    /// keeps the log recorded so far for crash images.
    pub fn set_recording(&self, on: bool) {
        let mut state = self.state.lock();
        if on && !state.recording {
            Self::restart_log(&mut state);
        }
        state.recording = on;
    }

    /// Empties the op log; its new base is the durable image, followed by the unflushed writes.
    pub fn clear_log(&self) {
        Self::restart_log(&mut self.state.lock());
    }

    fn restart_log(state: &mut MemState) {
        state.log_base.clone_from(&state.durable);
        state.log = state
            .pending
            .iter()
            .map(|(offset, data)| LogOp::Write {
                offset: *offset,
                data: data.clone(),
            })
            .collect();
    }

    /// Whether writes and flushes are being recorded.
    pub fn recording(&self) -> bool {
        self.state.lock().recording
    }

    /// A copy of the op log.
    pub fn op_log(&self) -> Vec<LogOp> {
        self.state.lock().log.clone()
    }

    /// A copy of the live image: every completed write.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().live.clone()
    }

    /// A copy of the durable image: the writes completed before the last successful flush.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// Number of flushes in the op log; crash points take `flush_index` in `0..=flush_count()`.
    pub fn flush_count(&self) -> usize {
        crash::flush_count(&self.state.lock().log)
    }

    /// The writes logged after flush number `flush_index` (0 = before the first flush), up to
    /// the next flush; empty when there is no such flush.
    pub fn writes_after_flush(&self, flush_index: usize) -> Vec<WriteExtent> {
        crash::epoch_writes(&self.state.lock().log, flush_index)
    }

    /// The device contents after a crash at `point`; `CrashPoint` error when `point` does not
    /// fit the log.
    pub fn crash_image(&self, point: &CrashPoint) -> Result<Vec<u8>, DeviceError> {
        let state = self.state.lock();
        crash::crash_image(&state.log_base, &state.log, self.sector_size, point)
    }

    /// A fresh device (recording on, no faults) holding the crash image at `point`.
    pub fn crash_device(&self, point: &CrashPoint) -> Result<MemDevice, DeviceError> {
        MemDevice::from_image(self.crash_image(point)?, self.sector_size)
    }

    /// Crash points for the current log; see [`crash::enumerate_crash_points`].
    pub fn crash_points(&self, random_per_flush: usize, seed: u64) -> Vec<CrashPoint> {
        let state = self.state.lock();
        crash::enumerate_crash_points(&state.log, self.sector_size, random_per_flush, seed)
    }

    /// Reads overlapping `range` (bytes) fail with `Injected` from now on.
    pub fn fail_reads_in(&self, range: Range<u64>) {
        self.state.lock().faults.fail_reads_in(range);
    }

    /// Writes and discards overlapping `range` (bytes) fail with `Injected` from now on.
    pub fn fail_writes_in(&self, range: Range<u64>) {
        self.state.lock().faults.fail_writes_in(range);
    }

    /// The `n`-th write from now (1 = the next one) fails with `Injected`, once.
    pub fn fail_nth_write(&self, n: u64) {
        self.state.lock().faults.fail_nth_write(n);
    }

    /// After `n` more successful writes the device stops: every later write, discard and flush
    /// returns `Stopped` (reads still work), as if power were lost at that moment.
    pub fn stop_after_writes(&self, n: u64) {
        self.state.lock().faults.stop_after_writes(n);
    }

    /// The next `n` flushes fail with `Injected` and make nothing durable.
    pub fn fail_flushes(&self, n: u64) {
        self.state.lock().faults.fail_flushes(n);
    }

    /// Disarms every fault and restarts a stopped device; counters are kept.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Whether `stop_after_writes` has fired.
    pub fn is_stopped(&self) -> bool {
        self.state.lock().faults.is_stopped()
    }

    /// Operation and fault counters.
    pub fn stats(&self) -> MemStats {
        self.state.lock().faults.stats
    }

    /// Applies a checked write of `data` at `offset` to the live image, pending list and log.
    fn store(&self, state: &mut MemState, offset: u64, data: &[u8]) {
        let start = to_index(offset);
        state.live[start..start + data.len()].copy_from_slice(data);
        state.pending.push((offset, data.to_vec()));
        if state.recording {
            state.log.push(LogOp::Write {
                offset,
                data: data.to_vec(),
            });
        }
        debug_assert_eq!(state.live.len() as u64, self.size_bytes);
    }

    fn check_writable(state: &MemState, op: &'static str) -> Result<(), DeviceError> {
        if state.read_only {
            return Err(DeviceError::ReadOnly { op });
        }
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        self.read_into(offset, buf)
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        check_transfer(offset, len, self.sector_size, self.size_bytes)?;
        let mut state = self.state.lock();
        state.faults.check_read(offset, len)?;
        let start = to_index(offset);
        let end = start + buf.len();
        buf.copy_from_slice(&state.live[start..end]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        self.write_from(offset, buf)
    }

    fn write_from(&self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        check_transfer(offset, buf.len() as u64, self.sector_size, self.size_bytes)?;
        let mut state = self.state.lock();
        Self::check_writable(&state, "write")?;
        state.faults.check_write(offset, buf.len() as u64)?;
        self.store(&mut state, offset, buf);
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        // A flush is allowed on a read-only device: it only makes earlier writes durable.
        let mut state = self.state.lock();
        state.faults.check_flush()?;
        let MemState {
            durable, pending, ..
        } = &mut *state;
        for (offset, data) in pending.drain(..) {
            let start = to_index(offset);
            durable[start..start + data.len()].copy_from_slice(&data);
        }
        if state.recording {
            state.log.push(LogOp::Flush);
        }
        Ok(())
    }

    /// Zeroes the range, recorded as a write of zeros so crash images see it like any write.
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        check_transfer(offset, len, self.sector_size, self.size_bytes)?;
        let mut state = self.state.lock();
        Self::check_writable(&state, "discard")?;
        state.faults.check_discard(offset, len)?;
        self.store(&mut state, offset, &vec![0; to_index(len)]);
        Ok(true)
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_sector_size(&self) -> u32 {
        self.sector_size
    }

    fn physical_sector_size(&self) -> u32 {
        self.sector_size
    }

    fn read_only(&self) -> bool {
        self.state.lock().read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(len: usize, byte: u8) -> AlignedBuf {
        AlignedBuf::from_slice(&vec![byte; len])
    }

    fn read(device: &MemDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = AlignedBuf::zeroed(len);
        device.read_at(offset, &mut buf).unwrap();
        buf.to_vec()
    }

    // Checks live versus durable images and the crash image at each flush point.
    #[test]
    fn live_durable_and_crash_images() {
        let device = MemDevice::new(4096, 512);
        device.write_at(0, &filled(512, 1)).unwrap();
        device.flush().unwrap();
        device.write_at(512, &filled(1024, 2)).unwrap();
        assert_eq!(read(&device, 512, 512), vec![2; 512]);
        assert_eq!(device.snapshot()[512], 2);
        assert_eq!(device.durable_image()[512], 0);
        assert_eq!(device.durable_image()[0], 1);
        assert_eq!(device.flush_count(), 1);
        let after = device.writes_after_flush(1);
        assert_eq!(
            after,
            vec![WriteExtent {
                offset: 512,
                len: 1024
            }]
        );
        let torn = device.crash_image(&CrashPoint::at_flush(1).tear(0, vec![false, true]));
        let torn = torn.unwrap();
        assert_eq!((torn[0], torn[512], torn[1024]), (1, 0, 2));
        let crashed = device.crash_device(&CrashPoint::at_flush(0)).unwrap();
        assert_eq!(crashed.snapshot(), vec![0; 4096]);
    }

    // Checks that restarting the log starts from the durable image plus the unflushed writes.
    #[test]
    fn restarted_log_keeps_unflushed_writes() {
        let device = MemDevice::new(2048, 512);
        device.set_recording(false);
        device.write_at(0, &filled(512, 7)).unwrap();
        device.flush().unwrap();
        device.write_at(512, &filled(512, 8)).unwrap();
        assert!(device.op_log().is_empty());
        device.set_recording(true);
        assert!(device.recording());
        assert_eq!(device.op_log().len(), 1);
        let image = device.crash_image(&CrashPoint::at_flush(0)).unwrap();
        assert_eq!((image[0], image[512]), (7, 0));
        device.flush().unwrap();
        device.clear_log();
        assert!(device.op_log().is_empty());
        assert_eq!(
            device.crash_image(&CrashPoint::at_flush(0)).unwrap()[512],
            8
        );
    }

    // Checks every injected fault, that refused operations change nothing, and the counters.
    #[test]
    fn injected_faults_change_nothing() {
        let device = MemDevice::new(8192, 4096);
        device.fail_reads_in(4096..4097);
        assert!(matches!(
            device.read_at(4096, &mut AlignedBuf::zeroed(4096)),
            Err(DeviceError::Injected { op: "read", .. })
        ));
        device.fail_writes_in(0..1);
        assert!(device.write_at(0, &filled(4096, 1)).is_err());
        device.fail_nth_write(1);
        assert!(device.write_at(4096, &filled(4096, 1)).is_err());
        assert!(device.snapshot().iter().all(|&b| b == 0));
        device.fail_flushes(1);
        assert!(device.flush().is_err());
        device.stop_after_writes(1);
        assert!(device.write_at(4096, &filled(4096, 3)).is_ok());
        assert!(matches!(
            device.write_at(4096, &filled(4096, 4)),
            Err(DeviceError::Stopped)
        ));
        assert!(matches!(device.flush(), Err(DeviceError::Stopped)));
        assert!(matches!(device.discard(0, 4096), Err(DeviceError::Stopped)));
        assert!(device.is_stopped());
        let stats = device.stats();
        assert_eq!(stats.read_faults, 1);
        assert_eq!(stats.write_faults, 2);
        assert_eq!(stats.flush_faults, 1);
        assert_eq!(stats.stopped_refusals, 3);
        device.clear_faults();
        assert!(device.discard(4096, 4096).unwrap());
        assert_eq!(read(&device, 4096, 4096), vec![0; 4096]);
        assert_eq!(device.stats().discards, 1);
    }

    // Checks geometry validation, read-only refusal and transfer checks.
    #[test]
    fn geometry_and_refusals() {
        assert!(matches!(
            MemDevice::try_new(4096, 1000),
            Err(DeviceError::Geometry { .. })
        ));
        assert!(matches!(
            MemDevice::try_new(4096, 8192),
            Err(DeviceError::Geometry { .. })
        ));
        assert!(matches!(
            MemDevice::try_new(1000, 512),
            Err(DeviceError::Geometry { .. })
        ));
        assert!(MemDevice::from_image(vec![0; 100], 512).is_err());
        let device = MemDevice::from_image(vec![5; 1024], 512).unwrap();
        assert_eq!(device.size_bytes(), 1024);
        assert_eq!(device.logical_sector_size(), 512);
        assert_eq!(device.physical_sector_size(), 512);
        assert_eq!(read(&device, 512, 512), vec![5; 512]);
        assert!(matches!(
            device.write_at(1, &filled(512, 0)),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            device.write_at(1024, &filled(512, 0)),
            Err(DeviceError::OutOfRange { .. })
        ));
        device.set_read_only(true);
        assert!(device.read_only());
        assert!(matches!(
            device.write_at(0, &filled(512, 0)),
            Err(DeviceError::ReadOnly { op: "write" })
        ));
        assert!(device.flush().is_ok());
        assert!(matches!(
            device.discard(0, 512),
            Err(DeviceError::ReadOnly { .. })
        ));
    }

    // Checks that `new` panics with a message on a bad geometry (documented behaviour).
    #[test]
    #[should_panic(expected = "MemDevice::new")]
    fn new_panics_on_bad_geometry() {
        let _ = MemDevice::new(100, 512);
    }

    // Checks that the device can be shared between threads writing disjoint sectors.
    #[test]
    fn concurrent_writers() {
        let device = std::sync::Arc::new(MemDevice::new(8 * 512, 512));
        let handles: Vec<_> = (0..8u8)
            .map(|index| {
                let device = std::sync::Arc::clone(&device);
                std::thread::spawn(move || {
                    device
                        .write_at(u64::from(index) * 512, &filled(512, index))
                        .unwrap();
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        for index in 0..8u8 {
            assert_eq!(read(&device, u64::from(index) * 512, 512), vec![index; 512]);
        }
    }
}
