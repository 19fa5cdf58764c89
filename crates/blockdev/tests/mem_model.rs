//! Model-based tests of `MemDevice`: random writes, flushes, reads, discards and injected faults
//! run on the device and on a plain reference model, then every crash image is checked.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use std::collections::BTreeSet;

use cairn_blockdev::{AlignedBuf, BlockDevice, CrashPoint, DeviceError, LogOp, MemDevice};
use proptest::prelude::*;

const SECTOR: u32 = 512;
const SECTOR_COUNT: u64 = 16;
const DEVICE_BYTES: u64 = SECTOR_COUNT * SECTOR as u64;

#[derive(Clone, Debug)]
enum Op {
    Write { sector: u64, count: u64, byte: u8 },
    Read { sector: u64, count: u64 },
    Discard { sector: u64, count: u64 },
    Flush,
    FailNextWrite,
    FailNextFlush,
}

fn extent() -> impl Strategy<Value = (u64, u64)> {
    (0..SECTOR_COUNT).prop_flat_map(|sector| (Just(sector), 1..=(SECTOR_COUNT - sector).min(4)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (extent(), any::<u8>())
            .prop_map(|((sector, count), byte)| Op::Write { sector, count, byte }),
        2 => extent().prop_map(|(sector, count)| Op::Read { sector, count }),
        1 => extent().prop_map(|(sector, count)| Op::Discard { sector, count }),
        2 => Just(Op::Flush),
        1 => Just(Op::FailNextWrite),
        1 => Just(Op::FailNextFlush),
    ]
}

/// The reference: the live image and the list of completed writes and flushes.
#[derive(Debug)]
struct Model {
    live: Vec<u8>,
    log: Vec<LogOp>,
    fail_next_write: bool,
    fail_next_flush: bool,
}

impl Model {
    fn new() -> Self {
        Self {
            live: vec![0; DEVICE_BYTES as usize],
            log: Vec::new(),
            fail_next_write: false,
            fail_next_flush: false,
        }
    }

    /// The image with every write before flush number `flush_index` applied.
    fn image_at_flush(&self, flush_index: usize) -> Vec<u8> {
        let mut image = vec![0; DEVICE_BYTES as usize];
        let mut flushes = 0;
        for op in &self.log {
            match op {
                _ if flushes == flush_index => break,
                LogOp::Flush => flushes += 1,
                LogOp::Write { offset, data } => put(&mut image, *offset, data),
            }
        }
        image
    }

    /// The writes between flush `flush_index` and the next one.
    fn epoch(&self, flush_index: usize) -> Vec<(u64, Vec<u8>)> {
        let mut flushes = 0;
        let mut writes = Vec::new();
        for op in &self.log {
            match op {
                LogOp::Flush => flushes += 1,
                LogOp::Write { offset, data } if flushes == flush_index => {
                    writes.push((*offset, data.clone()));
                }
                LogOp::Write { .. } => {}
            }
        }
        writes
    }
}

fn put(image: &mut [u8], offset: u64, data: &[u8]) {
    let start = offset as usize;
    image[start..start + data.len()].copy_from_slice(data);
}

fn step(device: &MemDevice, model: &mut Model, op: &Op) {
    match *op {
        Op::Write {
            sector,
            count,
            byte,
        } => {
            let data = vec![byte; (count * u64::from(SECTOR)) as usize];
            write_like(model, sector, data, |offset, data| {
                device
                    .write_at(offset, &AlignedBuf::from_slice(data))
                    .map(|()| true)
            });
        }
        Op::Discard { sector, count } => {
            let data = vec![0; (count * u64::from(SECTOR)) as usize];
            write_like(model, sector, data, |offset, data| {
                device.discard(offset, data.len() as u64)
            });
        }
        Op::Read { sector, count } => {
            let offset = sector * u64::from(SECTOR);
            let mut buf = AlignedBuf::zeroed((count * u64::from(SECTOR)) as usize);
            device.read_at(offset, &mut buf).unwrap();
            assert_eq!(
                &buf[..],
                &model.live[offset as usize..offset as usize + buf.len()]
            );
        }
        Op::Flush if model.fail_next_flush => {
            model.fail_next_flush = false;
            assert!(matches!(device.flush(), Err(DeviceError::Injected { .. })));
        }
        Op::Flush => {
            device.flush().unwrap();
            model.log.push(LogOp::Flush);
        }
        Op::FailNextWrite => {
            device.fail_nth_write(1);
            model.fail_next_write = true;
        }
        Op::FailNextFlush => {
            device.fail_flushes(1);
            model.fail_next_flush = true;
        }
    }
}

fn write_like(
    model: &mut Model,
    sector: u64,
    data: Vec<u8>,
    issue: impl Fn(u64, &[u8]) -> Result<bool, DeviceError>,
) {
    let offset = sector * u64::from(SECTOR);
    let result = issue(offset, &data);
    if model.fail_next_write {
        model.fail_next_write = false;
        assert!(
            matches!(result, Err(DeviceError::Injected { .. })),
            "{result:?}"
        );
        return;
    }
    assert!(result.unwrap());
    put(&mut model.live, offset, &data);
    model.log.push(LogOp::Write { offset, data });
}

/// The image a crash at `point` must leave, computed independently from the model.
fn expected_crash_image(model: &Model, point: &CrashPoint) -> Vec<u8> {
    let mut image = model.image_at_flush(point.flush_index);
    for (index, (offset, data)) in model.epoch(point.flush_index).iter().enumerate() {
        if point.kept_after.contains(&index) {
            put(&mut image, *offset, data);
        }
        let Some(torn) = point.torn.as_ref().filter(|torn| torn.write_index == index) else {
            continue;
        };
        for (sector, chunk) in data.chunks(SECTOR as usize).enumerate() {
            if torn.sectors_kept[sector] {
                put(
                    &mut image,
                    offset + sector as u64 * u64::from(SECTOR),
                    chunk,
                );
            }
        }
    }
    image
}

/// Every byte of `image` holds either the flush-point value or a value some write of the crash
/// epoch put at that byte; bytes no such write covers hold exactly the flush-point value.
fn check_bytes_allowed(model: &Model, point: &CrashPoint, image: &[u8]) {
    let durable = model.image_at_flush(point.flush_index);
    let epoch = model.epoch(point.flush_index);
    for (index, &byte) in image.iter().enumerate() {
        let mut allowed = BTreeSet::from([durable[index]]);
        for (offset, data) in &epoch {
            let start = *offset as usize;
            if (start..start + data.len()).contains(&index) {
                allowed.insert(data[index - start]);
            }
        }
        assert!(
            allowed.contains(&byte),
            "byte {index} = {byte}, allowed {allowed:?}"
        );
    }
}

fn flushes_in(log: &[LogOp]) -> usize {
    log.iter().filter(|op| matches!(op, LogOp::Flush)).count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    // Runs random ops on device and model; reads, images and every crash image must agree.
    #[test]
    fn mem_device_matches_model(ops in prop::collection::vec(op(), 1..40), seed in any::<u64>()) {
        let device = MemDevice::new(DEVICE_BYTES, SECTOR);
        let mut model = Model::new();
        for op in &ops {
            step(&device, &mut model, op);
        }
        prop_assert_eq!(device.snapshot(), model.live.clone());
        prop_assert_eq!(device.op_log(), model.log.clone());
        let flush_count = flushes_in(&model.log);
        prop_assert_eq!(device.flush_count(), flush_count);
        prop_assert_eq!(device.durable_image(), model.image_at_flush(flush_count));
        for flush_index in 0..=flush_count + 1 {
            prop_assert_eq!(device.writes_after_flush(flush_index).len(),
                if flush_index <= flush_count { model.epoch(flush_index).len() } else { 0 });
        }
        for point in device.crash_points(4, seed) {
            let image = device.crash_image(&point).unwrap();
            prop_assert_eq!(&image, &expected_crash_image(&model, &point));
            check_bytes_allowed(&model, &point, &image);
        }
        let beyond = CrashPoint::at_flush(flush_count + 1);
        let is_crash_point_error = matches!(
            device.crash_image(&beyond),
            Err(DeviceError::CrashPoint { .. })
        );
        prop_assert!(is_crash_point_error);
    }

    // Stops the device after N writes: later writes and flushes fail and change nothing.
    #[test]
    fn stop_after_writes_freezes_the_device(
        ops in prop::collection::vec(op(), 1..30),
        stop_after in 0u64..10,
    ) {
        let device = MemDevice::new(DEVICE_BYTES, SECTOR);
        device.stop_after_writes(stop_after);
        let mut accepted = 0u64;
        let mut stopped = stop_after == 0;
        let mut frozen: Option<(Vec<u8>, Vec<u8>)> = None;
        for (index, op) in ops.iter().enumerate() {
            let byte = index as u8;
            let result = match op {
                Op::Flush => device.flush().map(|()| true),
                Op::Discard { sector, count } => {
                    device.discard(sector * u64::from(SECTOR), count * u64::from(SECTOR))
                }
                Op::Write { sector, count, .. } => {
                    let data = vec![byte; (count * u64::from(SECTOR)) as usize];
                    let buf = AlignedBuf::from_slice(&data);
                    device.write_at(sector * u64::from(SECTOR), &buf).map(|()| true)
                }
                _ => continue,
            };
            let is_write = !matches!(op, Op::Flush);
            stopped |= is_write && accepted == stop_after;
            if stopped {
                prop_assert!(matches!(result, Err(DeviceError::Stopped)), "{:?}", result);
                let images = (device.snapshot(), device.durable_image());
                frozen.get_or_insert_with(|| images.clone());
                prop_assert_eq!(frozen.as_ref(), Some(&images));
            } else {
                prop_assert!(result.is_ok());
                accepted += u64::from(is_write);
            }
        }
        prop_assert_eq!(device.is_stopped(), stopped);
    }
}
