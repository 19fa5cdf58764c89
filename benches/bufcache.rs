//! Buffer cache benchmarks (being written).
fn main() {}
