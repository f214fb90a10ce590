//! The stats report as Prometheus text exposition (format 0.0.4), for node_exporter's
//! textfile collector or any scraper: every number of the report becomes a sample named
//! `loosefs_<section>_<field>` with the mountpoint as a label; latency percentiles become
//! `loosefs_latency_us{op, quantile}` gauges and the latency histograms one histogram family,
//! `loosefs_request_duration_seconds{op}` (cumulative `_bucket{le}` from 10 µs to 10 s and
//! `+Inf`, `_sum`, `_count`).

use crate::report::Report;
use serde_json::Value;
use std::fmt::Write;

/// Metric names are `[a-zA-Z_:][a-zA-Z0-9_:]*`: anything else becomes `_`.
fn name_part(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A label value with `\`, `"` and newlines escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every numeric and boolean leaf under `v`, as `(name, value)`, names joined by `_`.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Number(n) => out.extend(n.as_f64().map(|x| (prefix.to_string(), x))),
        Value::Bool(b) => out.push((prefix.to_string(), f64::from(u8::from(*b)))),
        Value::Object(m) => {
            for (k, x) in m {
                leaves(&format!("{prefix}_{}", name_part(k)), x, out);
            }
        }
        _ => {}
    }
}

/// The report of the mount at `mountpoint` as Prometheus text: one `# TYPE` line per metric
/// (`gauge`: values that go both ways and counters alike, as textfile metrics are), sorted by
/// name.
pub fn prometheus(r: &Report, mountpoint: &str) -> String {
    let v = serde_json::to_value(r).unwrap_or(Value::Null);
    let mnt = label(mountpoint);
    let mut out = String::new();
    let mut plain = Vec::new();
    if let Value::Object(m) = &v {
        for (k, x) in m {
            if k != "latency_us" {
                leaves(&format!("loosefs_{}", name_part(k)), x, &mut plain);
            }
        }
    }
    plain.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, x) in plain {
        let _ = writeln!(
            out,
            "# TYPE {name} gauge\n{name}{{mountpoint=\"{mnt}\"}} {x}"
        );
    }
    let _ = writeln!(out, "# TYPE loosefs_latency_us gauge");
    for (op, l) in &r.latency_us {
        for (q, x) in [("0.5", l.p50_us), ("0.9", l.p90_us), ("0.99", l.p99_us)] {
            let _ = writeln!(
                out,
                "loosefs_latency_us{{mountpoint=\"{mnt}\",op=\"{}\",quantile=\"{q}\"}} {x}",
                label(op)
            );
        }
    }
    let name = "loosefs_request_duration_seconds";
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (op, l) in &r.latency_us {
        let labels = format!("mountpoint=\"{mnt}\",op=\"{}\"", label(op));
        for b in &l.buckets {
            let le = b.le_us / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {}", b.count);
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", l.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", l.sum_us / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", l.count);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_follow_the_exposition_format() {
        assert_eq!(name_part("rss-bytes.x"), "rss_bytes_x");
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
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
    }
}
