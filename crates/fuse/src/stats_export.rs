//! The statistics for monitoring agents: `cairn stats --json` and `cairn stats --format
//! openmetrics` (which Prometheus' node_exporter textfile collector reads). The same
//! counters as the text view, read from the same snapshots, under stable names that
//! `docs/user-guide.md` ("Statistics for monitoring") lists with their units.
//!
//! A subsystem's counter keeps its text-view name in JSON (`"journal": {"log_bytes": ..}`)
//! and becomes `cairn_<section>_<name>` in OpenMetrics, in base units: `_ns` fields as
//! seconds (`_seconds`), `_bytes` fields as bytes; counters end in `_total`, the few
//! levels (`GAUGES`) are gauges. The daemon renders both, so a reader needs no parser of
//! the text view: getxattr of [`STATS_JSON_XATTR`] or [`STATS_OPENMETRICS_XATTR`] on the
//! mount's root.

use std::sync::atomic::AtomicU64;

use cairn_fs::FsStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use serde_json::{Map, Value, json};

use crate::stats::{OpSnapshot, RequestStats};

/// The reserved attribute whose value is the statistics as JSON.
pub const STATS_JSON_XATTR: &str = "system.cairn.stats.json";
/// The reserved attribute whose value is the statistics in the OpenMetrics text format.
pub const STATS_OPENMETRICS_XATTR: &str = "system.cairn.stats.openmetrics";

/// The JSON layout's version (`"format"`): bumped when a name changes meaning or goes.
pub const JSON_FORMAT: &str = "cairn-stats/1";

/// Subsystem fields that are levels, not counts of events: gauges in OpenMetrics.
const GAUGES: &[(&str, &str)] = &[
    ("fs", "inodes_cached"),
    ("alloc", "last_records_visited"),
    ("extcache", "objects"),
    ("extcache", "reclaimable_objects"),
    ("extcache", "inodes_on_list"),
    ("extcache", "scan_time_avg_ns"),
    ("extcache", "scan_time_max_ns"),
    ("extcache", "scan_cpu_avg_ns"),
    ("extcache", "scan_cpu_max_ns"),
    ("write_behind", "cap_bytes"),
    ("write_behind", "dirty_bytes"),
    ("write_behind", "reserved_blocks"),
    ("reads", "buffer_bytes"),
    ("reads", "buffer_cap_bytes"),
];

/// One subsystem counter as the text view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub section: &'static str,
    pub name: String,
    pub value: u64,
}

/// Every subsystem's counters, section by section, in the text view's order; a field that
/// is not a whole number is left out (all are today: `tests` checks it).
pub fn subsystem_fields(fs: &FsStats) -> Vec<Field> {
    let sections = [
        ("fs", format!("{:#?}", fs.fs)),
        ("bufcache", format!("{:#?}", fs.bufcache)),
        ("journal", format!("{:#?}", fs.journal)),
        ("alloc", format!("{:#?}", fs.alloc)),
        ("data", format!("{:#?}", fs.data)),
        ("extcache", format!("{:#?}", fs.extcache)),
        ("write_behind", format!("{:#?}", fs.write_behind)),
        ("reflink", format!("{:#?}", fs.reflink)),
        ("reads", format!("{:#?}", fs.reads)),
    ];
    let mut fields = Vec::new();
    for (section, debug) in sections {
        for (name, value) in debug_fields(&debug) {
            if let Ok(value) = value.parse() {
                fields.push(Field {
                    section,
                    name,
                    value,
                });
            }
        }
    }
    fields
}

/// The `name: value` pairs of a `{:#?}` dump of a flat struct.
fn debug_fields(debug: &str) -> Vec<(String, String)> {
    debug
        .lines()
        .skip(1)
        .filter_map(|line| {
            let (name, value) = line.trim().trim_end_matches(',').split_once(": ")?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

/// Nanoseconds of a percentile given in microseconds.
fn percentile_ns(op: &OpSnapshot, fraction: f64) -> u64 {
    (op.percentile_us(fraction) * 1000.0).round() as u64
}

/// The statistics as a JSON document (see the module doc and `docs/user-guide.md`).
pub fn render_json(fs: &FsStats, requests: &RequestStats) -> String {
    let mut root = Map::new();
    root.insert("format".into(), json!(JSON_FORMAT));
    root.insert("uptime_seconds".into(), json!(requests.uptime_secs()));
    root.insert("shut_down".into(), json!(fs.shutdown));
    for field in subsystem_fields(fs) {
        let section = root
            .entry(field.section)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(section) = section {
            section.insert(field.name, json!(field.value));
        }
    }
    let transport: Map<String, Value> = requests
        .transport_lines()
        .iter()
        .filter_map(|line| line.split_once(": "))
        .map(|(key, value)| (key.to_string(), json!(value)))
        .collect();
    root.insert("fuse_transport".into(), Value::Object(transport));
    let flying = requests.in_flight();
    let oldest = flying.first().map(|oldest| {
        json!({"request": oldest.name, "node": oldest.node,
               "age_ns": oldest.age.as_nanos() as u64})
    });
    root.insert(
        "fuse_in_flight".into(),
        json!({"requests": flying.len(), "oldest": oldest}),
    );
    let mut by_type = Map::new();
    for op in requests.snapshot().iter().filter(|op| op.count > 0) {
        by_type.insert(
            op.name.to_string(),
            json!({
                "count": op.count, "errors": op.errors, "total_ns": op.total_ns,
                "max_ns": op.max_ns, "slow_ns": op.slow_ns,
                "p50_ns": percentile_ns(op, 0.5), "p99_ns": percentile_ns(op, 0.99),
            }),
        );
    }
    root.insert("fuse_requests".into(), Value::Object(by_type));
    let mut text = Value::Object(root).to_string();
    text.push('\n');
    text
}

/// The label of a per-request-type metric.
type RequestLabel = Vec<(String, String)>;

fn request_label(op: &OpSnapshot) -> RequestLabel {
    vec![("request".to_string(), op.name.to_string())]
}

/// Registers one subsystem field under its OpenMetrics name and unit.
fn register_field(registry: &mut Registry, field: &Field) {
    let gauge = GAUGES.contains(&(field.section, field.name.as_str()));
    let help = format!("cairn stats [{}] {}", field.section, field.name);
    let base = format!("{}_{}", field.section, field.name);
    if let Some(name) = base.strip_suffix("_ns") {
        let seconds = field.value as f64 / 1e9;
        match gauge {
            true => registry.register_with_unit(
                name,
                help,
                Unit::Seconds,
                ConstGauge::<f64>::new(seconds),
            ),
            false => registry.register_with_unit(
                name,
                help,
                Unit::Seconds,
                ConstCounter::<f64>::new(seconds),
            ),
        }
        return;
    }
    let (name, unit) = match base.strip_suffix("_bytes") {
        Some(name) => (name.to_string(), Some(Unit::Bytes)),
        None => (base.clone(), None),
    };
    let value = i64::try_from(field.value).unwrap_or(i64::MAX);
    match (gauge, unit) {
        (true, Some(unit)) => {
            registry.register_with_unit(name, help, unit, ConstGauge::<i64>::new(value))
        }
        (true, None) => registry.register(name, help, ConstGauge::<i64>::new(value)),
        (false, unit) => {
            // The encoder adds `_total` to a counter's name.
            let name = name.strip_suffix("_total").unwrap_or(&name).to_string();
            let counter = ConstCounter::<u64>::new(field.value);
            match unit {
                Some(unit) => registry.register_with_unit(name, help, unit, counter),
                None => registry.register(name, help, counter),
            }
        }
    }
}

/// Registers the per-request-type counters and latencies.
fn register_requests(registry: &mut Registry, requests: &RequestStats) {
    let counts = Family::<RequestLabel, Counter>::default();
    let errors = Family::<RequestLabel, Counter>::default();
    let seconds = Family::<RequestLabel, Counter<f64, AtomicU64>>::default();
    let slow = Family::<RequestLabel, Counter<f64, AtomicU64>>::default();
    let max = Family::<RequestLabel, Gauge<f64, AtomicU64>>::default();
    let p50 = Family::<RequestLabel, Gauge<f64, AtomicU64>>::default();
    let p99 = Family::<RequestLabel, Gauge<f64, AtomicU64>>::default();
    for op in requests.snapshot().iter().filter(|op| op.count > 0) {
        let label = request_label(op);
        counts.get_or_create(&label).inc_by(op.count);
        errors.get_or_create(&label).inc_by(op.errors);
        seconds
            .get_or_create(&label)
            .inc_by(op.total_ns as f64 / 1e9);
        slow.get_or_create(&label).inc_by(op.slow_ns as f64 / 1e9);
        max.get_or_create(&label).set(op.max_ns as f64 / 1e9);
        p50.get_or_create(&label).set(op.percentile_us(0.5) / 1e6);
        p99.get_or_create(&label).set(op.percentile_us(0.99) / 1e6);
    }
    registry.register("fuse_requests", "FUSE requests served, by type", counts);
    let help = "FUSE requests that failed, by type";
    registry.register("fuse_request_errors", help, errors);
    let help = "Time spent serving FUSE requests, by type";
    registry.register_with_unit("fuse_request", help, Unit::Seconds, seconds);
    let help = "Time spent in FUSE requests slower than 1 ms, by type";
    registry.register_with_unit("fuse_request_slow", help, Unit::Seconds, slow);
    let help = "Longest FUSE request, by type";
    registry.register_with_unit("fuse_request_max", help, Unit::Seconds, max);
    let help = "Median FUSE request latency (a bucket's upper bound, at most 25% high)";
    registry.register_with_unit("fuse_request_p50", help, Unit::Seconds, p50);
    let help = "99th percentile FUSE request latency (a bucket's upper bound)";
    registry.register_with_unit("fuse_request_p99", help, Unit::Seconds, p99);
}

/// The statistics in the OpenMetrics text format (see the module doc).
pub fn render_openmetrics(fs: &FsStats, requests: &RequestStats) -> String {
    let mut registry = Registry::with_prefix("cairn");
    let uptime = ConstGauge::<f64>::new(requests.uptime_secs());
    let help = "Time since the mount";
    registry.register_with_unit("uptime", help, Unit::Seconds, uptime);
    let shut_down = ConstGauge::<i64>::new(i64::from(fs.shutdown.is_some()));
    let help = "1 once an error has shut the filesystem down (see cairn stats)";
    registry.register("shut_down", help, shut_down);
    for field in subsystem_fields(fs) {
        register_field(&mut registry, &field);
    }
    let transport = requests
        .transport_lines()
        .iter()
        .find_map(|line| line.strip_prefix("transport: ").map(str::to_string));
    if let Some(transport) = transport {
        let info = Info::new(vec![("transport".to_string(), transport)]);
        registry.register("fuse_transport", "How the kernel's requests arrive", info);
    }
    let flying = requests.in_flight();
    let in_flight = ConstGauge::<i64>::new(flying.len() as i64);
    registry.register("fuse_in_flight", "FUSE requests being served", in_flight);
    let age = flying
        .first()
        .map_or(0.0, |oldest| oldest.age.as_secs_f64());
    let help = "Age of the oldest FUSE request being served";
    let age = ConstGauge::<f64>::new(age);
    registry.register_with_unit("fuse_oldest_request_age", help, Unit::Seconds, age);
    register_requests(&mut registry, requests);
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Op;

    fn sample_stats() -> FsStats {
        FsStats {
            shutdown: None,
            fs: Default::default(),
            bufcache: Default::default(),
            journal: Default::default(),
            alloc: Default::default(),
            data: Default::default(),
            extcache: Default::default(),
            write_behind: Default::default(),
            reflink: Default::default(),
            reads: Default::default(),
        }
    }

    // Every line of every section of the text view is a whole-number field here: the
    // exports leave nothing out.
    #[test]
    fn every_text_field_is_exported() {
        let stats = sample_stats();
        let text = crate::stats::render(&stats, &RequestStats::default());
        let in_sections: usize = text
            .split("[fuse ")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with("  "))
            .count();
        assert_eq!(subsystem_fields(&stats).len(), in_sections);
        for (section, name) in GAUGES {
            let known = subsystem_fields(&stats)
                .iter()
                .any(|f| f.section == *section && f.name == *name);
            assert!(known, "gauge {section}.{name} is not a field");
        }
    }

    // The JSON parses, with the sections, names and request types of the text view.
    #[test]
    fn json_has_the_text_views_counters() {
        let requests = RequestStats::default();
        drop(requests.start(Op::Statx, 1));
        let value: Value =
            serde_json::from_str(&render_json(&sample_stats(), &requests)).expect("valid JSON");
        assert_eq!(value["format"], JSON_FORMAT);
        assert_eq!(value["journal"]["log_bytes"], 0);
        assert_eq!(value["fuse_requests"]["statx"]["count"], 1);
        assert!(value["shut_down"].is_null());
    }

    // The OpenMetrics text names counters with `_total`, base units, and ends with EOF.
    #[test]
    fn openmetrics_uses_base_units() {
        let requests = RequestStats::default();
        drop(requests.start(Op::Lookup, 1));
        let text = render_openmetrics(&sample_stats(), &requests);
        for line in [
            "# TYPE cairn_journal_log_bytes counter",
            "cairn_journal_log_bytes_total 0",
            "# TYPE cairn_write_behind_dirty_bytes gauge",
            "cairn_extcache_scan_time_avg_seconds 0.0",
            "cairn_extcache_shrunk_objects_total 0",
            "cairn_fuse_requests_total{request=\"lookup\"} 1",
            "cairn_shut_down 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
