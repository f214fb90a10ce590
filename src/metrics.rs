//! The stats report as Prometheus metrics, encoded by the `prometheus-client` crate (the
//! Prometheus project's Rust client) in the OpenMetrics text format, which Prometheus and
//! node_exporter's textfile collector read. Every number of the report becomes one family
//! named `loosefs_<section>_<field>` with the mountpoint as a label:
//! - a **counter** (`# TYPE … counter`, sample `…_total`) when it only grows while mounted
//!   (requests, GETs, bytes served, hits, decodes);
//! - a **gauge** when it goes both ways or is a setting ([`GAUGES`]: sizes held now, budgets,
//!   the daemon's memory, booleans as 0/1);
//! - `# HELP` is the report field's own documentation (read from `report.rs` at build time),
//!   and a field in seconds is named `_seconds` (`uptime_s` → `uptime_seconds`).
//!
//! Latency: `loosefs_latency_us{op, quantile}` gauges (p50, p90, p99, microseconds) and one
//! histogram family, `loosefs_request_duration_seconds{op}` (buckets from 10 µs to 10 s and
//! `+Inf`, `_sum`, `_count`).

use crate::report::{Latency, Report};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

/// Report fields (metric names without `loosefs_`, or their ends after `_`) that go both
/// ways or are settings: gauges. Every other number only grows while mounted: a counter.
const GAUGES: &[&str] = &[
    "pack_bytes",
    "pack_samples",
    "pack_resident_bytes",
    "daemon_pid",
    "daemon_uptime_s",
    "daemon_rss_bytes",
    "daemon_rss_peak_bytes",
    "daemon_locked_bytes",
    "daemon_threads",
    "daemon_transport_queues",
    "daemon_transport_ring_threads",
    "daemon_keeper_pid",
    "page_cache_keep_pack_cache",
    "prefetch_max_window_bytes",
    "prefetch_unserved_bytes",
    "order_window_max_bytes",
    "order_live",
    "order_samples",
    "order_window_bytes",
    "pin_target_bytes",
    "pin_pinned_bytes",
    "warm_bytes_done",
    "warm_bytes_total",
    "warm_mb_per_s",
    "warm_limited_by_memory",
    "decode_views_npy",
    "decode_views_ppm",
    "decode_views_decoded_only",
    "decode_views_max_side",
    "decode_threads",
    "decode_ahead_files",
    "decode_accept_damaged",
    "decode_cache_budget_bytes",
    "decode_cache_bytes",
    "decode_cache_entries",
    "decode_cache_in_flight",
    "decode_decode_us_max_us",
    "decode_decode_us_p50_us",
    "decode_decode_us_p90_us",
    "decode_decode_us_p99_us",
    "remote_cached_bytes",
    "remote_cache_limit_bytes",
    "remote_offline",
    "remote_exact_held_bytes",
    "frames_cached_bytes",
    "frames_budget_bytes",
    "frames_threads",
    "changes_watched_dirs",
    "changes_unwatched_dirs",
];

/// `report.rs`'s text: the `# HELP` of each family is its field's `///` comment.
const REPORT_RS: &str = include_str!("report.rs");

/// Metric names are `[a-zA-Z_:][a-zA-Z0-9_:]*`: anything else becomes `_`.
fn name_part(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Every numeric and boolean leaf under `v`, as `(name, value)`, names joined by `_`.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Number(n) => out.extend(n.as_f64().map(|x| (prefix.to_string(), x))),
        Value::Bool(b) => out.push((prefix.to_string(), f64::from(u8::from(*b)))),
        Value::Object(m) => {
            for (k, x) in m {
                let name = if prefix.is_empty() {
                    name_part(k)
                } else {
                    format!("{prefix}_{}", name_part(k))
                };
                leaves(&name, x, out);
            }
        }
        _ => {}
    }
}

/// The `///` documentation of each field of the report, by its name as a metric (without
/// `loosefs_`): `report.rs` read struct by struct, from `Report` down through the fields whose
/// type is another struct of the file. A map field (`requests`) documents its entries.
fn field_docs() -> BTreeMap<String, String> {
    // struct -> [(field, doc, type)]
    let mut structs: BTreeMap<&str, Vec<(&str, String, &str)>> = BTreeMap::new();
    let (mut current, mut doc) = (None, Vec::new());
    for line in REPORT_RS.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("pub struct ") {
            current = name.split([' ', '{', '(']).next();
            doc.clear();
        } else if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim());
        } else if let (Some(s), Some(field)) = (current, line.strip_prefix("pub ")) {
            if let Some((name, ty)) = field.split_once(": ") {
                let ty = ty.trim_end_matches(',');
                let inner = ty
                    .trim_start_matches("Option<")
                    .trim_end_matches('>')
                    .trim();
                let text = doc.join(" ");
                structs.entry(s).or_default().push((name, text, inner));
            }
            doc.clear();
        } else if !line.starts_with("#[") {
            doc.clear();
        }
    }
    let mut out = BTreeMap::new();
    let mut todo = vec![("Report", String::new())];
    while let Some((s, prefix)) = todo.pop() {
        for (field, text, ty) in structs.get(s).into_iter().flatten() {
            let name = if prefix.is_empty() {
                field.to_string()
            } else {
                format!("{prefix}_{field}")
            };
            if structs.contains_key(ty) {
                todo.push((ty, name.clone()));
            }
            out.insert(name, text.clone());
        }
    }
    out
}

/// The help of the leaf `name`: its field's documentation, or its map's (the longest
/// documented prefix), or its name.
fn help_of(docs: &BTreeMap<String, String>, name: &str) -> String {
    let mut at = name;
    loop {
        // The encoder ends every help with a full stop of its own.
        if let Some(d) = docs.get(at).filter(|d| !d.is_empty()) {
            return d.trim_end_matches('.').to_string();
        }
        match at.rfind('_') {
            Some(i) => at = &at[..i],
            None => return format!("stats field {name}"),
        }
    }
}

fn is_gauge(name: &str) -> bool {
    GAUGES.contains(&name)
}

/// The name a leaf is exposed under: `loosefs_` and the leaf, with a unit in seconds spelled
/// out (`_s` → `_seconds`).
fn exposed(name: &str) -> String {
    match name.strip_suffix("_s") {
        Some(stem) if !name.ends_with("per_s") => format!("loosefs_{stem}_seconds"),
        _ => format!("loosefs_{name}"),
    }
}

/// Latency histograms already counted (the report's cumulative buckets per op), encoded as
/// one histogram family labelled by `op`.
#[derive(Debug)]
struct Histograms(Vec<OpHistogram>);

/// One operation's latency histogram: its name, sum (seconds), count, and buckets as
/// [`buckets_of`] gives them.
#[derive(Debug)]
struct OpHistogram {
    op: String,
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for Histograms {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for h in &self.0 {
            let labels = [("op", h.op.as_str())];
            encoder
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The report's cumulative buckets `l` (µs) as the encoder takes them: upper bounds in
/// seconds, counts per bucket (it sums them), the last bound `+Inf`.
fn buckets_of(l: &Latency) -> Vec<(f64, u64)> {
    let mut out = Vec::new();
    let mut below = 0;
    for b in &l.buckets {
        out.push((b.le_us / 1e6, b.count.saturating_sub(below)));
        below = b.count.max(below);
    }
    out.push((f64::MAX, l.count.saturating_sub(below)));
    out
}

/// `v` escaped as a label value of the text formats (`\`, `"` and a line feed as `\\`,
/// `\"` and `\n`: Prometheus's exposition format and OpenMetrics 1.0, "ABNF"):
/// `prometheus-client` writes label values as they are, and a mountpoint may hold any of
/// them (one `"` would make every scrape of the mount fail to parse).
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The report of the mount at `mountpoint` in Prometheus's text format 0.0.4 (what `stats
/// --format prometheus` prints and `<mnt>/.loosefs/metrics` holds: node_exporter's textfile
/// collector reads this format, not OpenMetrics): [`openmetrics`] with each counter family
/// named by its `_total` samples and no `# EOF`.
pub fn prometheus(r: &Report, mountpoint: &str) -> String {
    let om = openmetrics(r, mountpoint);
    let counters: std::collections::HashSet<&str> = (om.lines())
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let infos: std::collections::HashSet<&str> = (om.lines())
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" info"))
        .collect();
    let mut out = String::with_capacity(om.len() + 8 * counters.len());
    for line in om.lines().filter(|l| *l != "# EOF") {
        let head = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|h| line.starts_with(h));
        match head.and_then(|h| Some((h, line[h.len()..].split_once(' ')?))) {
            Some((h, (name, rest))) if counters.contains(name) => {
                out += &format!("{h}{name}_total {rest}\n");
            }
            // Text 0.0.4 has no info type: the `_info` sample is a gauge of value 1.
            Some(("# TYPE ", (name, "info"))) => {
                out += &format!("# TYPE {name}_info gauge\n");
            }
            Some((h, (name, rest))) if infos.contains(name) => {
                out += &format!("{h}{name}_info {rest}\n");
            }
            _ => {
                out += line;
                out.push('\n');
            }
        }
    }
    out
}

/// The report of the mount at `mountpoint` as OpenMetrics text (`stats --format openmetrics`),
/// encoded by `prometheus-client`.
pub fn openmetrics(r: &Report, mountpoint: &str) -> String {
    let v = serde_json::to_value(r).unwrap_or(Value::Null);
    let mut registry = Registry::with_labels(std::iter::once((
        Cow::Borrowed("mountpoint"),
        Cow::Owned(label_value(mountpoint)),
    )));
    let docs = field_docs();
    let mut plain = Vec::new();
    if let Value::Object(m) = &v {
        for (k, x) in m.iter().filter(|(k, _)| k.as_str() != "latency_us") {
            leaves(&name_part(k), x, &mut plain);
        }
    }
    plain.sort_by(|a, b| a.0.cmp(&b.0));
    // Which build serves: `loosefs_build_info{version, commit} 1` (the `_info` convention).
    registry.register(
        "loosefs_build",
        "The loosefs build serving this mount",
        prometheus_client::metrics::info::Info::new(vec![
            ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("commit".to_string(), env!("LOOSEFS_COMMIT").to_string()),
        ]),
    );
    for (leaf, x) in plain {
        let (name, help) = (exposed(&leaf), help_of(&docs, &leaf));
        if is_gauge(&leaf) {
            let g = Gauge::<f64, AtomicU64>::default();
            g.set(x);
            registry.register(name, help, g);
        } else {
            let c = Counter::<f64, AtomicU64>::default();
            c.inc_by(x);
            registry.register(name, help, c);
        }
    }
    let quantiles = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    for (op, l) in &r.latency_us {
        for (q, x) in [("0.5", l.p50_us), ("0.9", l.p90_us), ("0.99", l.p99_us)] {
            let labels = vec![("op".into(), op.clone()), ("quantile".into(), q.into())];
            quantiles.get_or_create(&labels).set(x);
        }
    }
    registry.register(
        "loosefs_latency_us",
        "Time to answer a request, microseconds, at quantiles 0.5, 0.9 and 0.99 since the mount",
        quantiles,
    );
    let hist = (r.latency_us.iter())
        .map(|(op, l)| OpHistogram {
            op: op.clone(),
            sum: l.sum_us / 1e6,
            count: l.count,
            buckets: buckets_of(l),
        })
        .collect();
    registry.register(
        "loosefs_request_duration_seconds",
        "Time to answer a request, seconds, by operation",
        Histograms(hist),
    );
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountpoint_with_quotes_backslashes_and_newlines_is_escaped_in_the_label() {
        assert_eq!(label_value("/x/m\"q\\b\nz"), "/x/m\\\"q\\\\b\\nz");
    }

    #[test]
    fn names_kinds_and_help_come_from_the_report() {
        assert_eq!(name_part("rss-bytes.x"), "rss_bytes_x");
        let mut out = Vec::new();
        let v: Value = serde_json::json!({"a": {"b": 2, "c": true, "d": "text", "e": null}});
        leaves("loosefs", &v, &mut out);
        assert_eq!(
            out,
            vec![
                ("loosefs_a_b".to_string(), 2.0),
                ("loosefs_a_c".to_string(), 1.0)
            ]
        );
        let docs = field_docs();
        assert_eq!(help_of(&docs, "bytes_served"), "Bytes returned by READ");
        assert!(docs["remote_gets"].starts_with(&help_of(&docs, "remote_gets")));
        assert!(help_of(&docs, "requests_read").starts_with("Requests answered, by operation"));
        assert_eq!(exposed("daemon_uptime_s"), "loosefs_daemon_uptime_seconds");
        assert_eq!(exposed("warm_mb_per_s"), "loosefs_warm_mb_per_s");
        // Every gauge names a field the report documents.
        for g in GAUGES {
            assert!(!help_of(&docs, g).starts_with("stats field"), "{g}");
        }
    }
}
