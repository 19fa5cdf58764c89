#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The fast part of the repair sweep (the full one is `cairn-repair-sweep`, see
//! docs/reliability.md): every unit kind of the base image damaged in every way once (a bit
//! flipped, the block zeroed, garbage) and a rotating sample of fields changed with the CRC
//! recomputed; after `fsck.cairn -y` each case must check clean, repair nothing more, and
//! have lost only what the damaged unit held.

use std::sync::Arc;

use cairn_crashtest::repair_base::build_base;
use cairn_crashtest::repair_fuzz::{fast_cases, select_units, sweep};

#[test]
fn repair_sweep_sample() {
    let base = Arc::new(build_base().unwrap());
    let units = select_units(&base);
    let cases = fast_cases(&base, &units);
    let tally = sweep(&base, &units, &cases, 2, &|_, _| {}).unwrap();
    eprint!("{}", tally.table());
    for (unit, damage, failures) in tally.failures.iter().take(10) {
        eprintln!("FAILED {unit}, {damage}: {}", failures.join("; "));
    }
    assert!(tally.cases() >= 100, "only {} cases ran", tally.cases());
    assert!(
        tally.failures.is_empty(),
        "{} of {} cases failed",
        tally.failures.len(),
        tally.cases()
    );
}
