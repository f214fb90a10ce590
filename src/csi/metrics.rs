//! `loosefs csi --metrics-addr`: every staged volume's metrics on one port per node, for a
//! Prometheus server to scrape (`GET /metrics`, Prometheus text 0.0.4, served by
//! [`crate::mount::metrics_endpoint`]). Each volume's daemon writes its own families to
//! `<staging>/.loosefs/metrics` (the text `loosefs stats --format prometheus` prints); they are
//! read at each scrape and merged, each sample labelled `volume="ID"` besides its `mountpoint`,
//! each family's HELP and TYPE said once. `loosefs_csi_volume_up{volume}` is 1 for a volume
//! whose daemon answered, 0 for one that did not (gone: ENOTCONN; or not within
//! [`READ_WITHIN`]) — the alert for a volume nobody serves.
//!
//! A daemon that hangs costs one blocked thread, not one per scrape: a volume whose last read
//! has not returned is reported down without being read again.

use super::NodeConfig;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a scrape waits for one volume's metrics.
const READ_WITHIN: Duration = Duration::from_secs(2);

/// Binds `addr` and serves the node's volumes' metrics on a thread of its own. Errors: the
/// address cannot be bound (named with the flag), the thread cannot start.
pub(super) fn serve(addr: std::net::SocketAddr, config: Arc<NodeConfig>) -> anyhow::Result<()> {
    let endpoint = crate::mount::metrics_endpoint::Endpoint::bind(addr)?;
    crate::eprintln_lossy!(
        "loosefs csi: the volumes' metrics at http://{}/metrics",
        endpoint.addr()
    );
    endpoint.serve_prometheus(Arc::new(move || render(&config)))
}

/// The merged text of every staged volume's metrics, read now.
fn render(config: &NodeConfig) -> String {
    static READING: super::target::Asking = std::sync::OnceLock::new();
    let mut parts = Vec::new();
    let mut up = Vec::new();
    for staged in super::work_dir::all_staged(config) {
        let id = staged.volume_id.clone();
        let file = staged.staging.join(".loosefs").join("metrics");
        let text = super::target::ask_within(&READING, &file, READ_WITHIN, |p| {
            std::fs::read_to_string(p).ok()
        })
        .flatten();
        up.push((id.clone(), text.is_some()));
        if let Some(text) = text {
            parts.push((id, text));
        }
    }
    let mut out = merge(&parts);
    out.push_str(
        "# HELP loosefs_csi_volume_up Whether the volume's daemon answered this scrape (1) or \
         not (0: gone, or busy beyond 2 s).\n# TYPE loosefs_csi_volume_up gauge\n",
    );
    for (id, ok) in up {
        out.push_str(&format!(
            "loosefs_csi_volume_up{{volume=\"{}\"}} {}\n",
            escape(&id),
            u8::from(ok)
        ));
    }
    out
}

/// A label value escaped as Prometheus text requires (`\`, `"`, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Merges several volumes' Prometheus texts (volume id, text) into one exposition: families in
/// the order first seen, each family's `# HELP` and `# TYPE` once, its samples from every volume
/// with `volume="ID"` added as the first label. OpenMetrics' `# EOF` is dropped.
pub(super) fn merge(parts: &[(String, String)]) -> String {
    struct Family {
        meta: Vec<String>,
        samples: Vec<String>,
    }
    let mut order: Vec<String> = Vec::new();
    let mut families: HashMap<String, Family> = HashMap::new();
    for (volume, text) in parts {
        let label = format!("volume=\"{}\"", escape(volume));
        let mut current = String::new();
        for line in text.lines() {
            let family = |name: &str, order: &mut Vec<String>, families: &mut HashMap<_, _>| {
                if !families.contains_key(name) {
                    order.push(name.to_string());
                    families.insert(
                        name.to_string(),
                        Family {
                            meta: Vec::new(),
                            samples: Vec::new(),
                        },
                    );
                }
            };
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                let name = rest.split_whitespace().next().unwrap_or_default();
                family(name, &mut order, &mut families);
                let f = families.get_mut(name).expect("just made");
                if !f.meta.iter().any(|m| m == line) {
                    f.meta.push(line.to_string());
                }
                current = name.to_string();
            } else if line.starts_with('#') || line.trim().is_empty() {
                continue;
            } else {
                let name_end = line.find(['{', ' ']).unwrap_or(line.len());
                let labelled = match line.as_bytes().get(name_end) {
                    Some(b'{') if line[name_end + 1..].starts_with('}') => {
                        format!("{}{{{label}{}", &line[..name_end], &line[name_end + 1..])
                    }
                    Some(b'{') => {
                        format!("{}{{{label},{}", &line[..name_end], &line[name_end + 1..])
                    }
                    _ => format!("{}{{{label}}}{}", &line[..name_end], &line[name_end..]),
                };
                // A histogram's or summary's samples belong to the family last typed; any
                // other name is a family of its own.
                let name = &line[..name_end];
                let of_current = !current.is_empty()
                    && (name == current
                        || name.strip_prefix(current.as_str()).is_some_and(|s| {
                            ["_bucket", "_sum", "_count", "_created", "_total"].contains(&s)
                        }));
                let key = if of_current {
                    current.clone()
                } else {
                    name.to_string()
                };
                family(&key, &mut order, &mut families);
                families
                    .get_mut(&key)
                    .expect("just made")
                    .samples
                    .push(labelled);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let f = &families[&name];
        for l in f.meta.iter().chain(&f.samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_said_once_and_every_sample_names_its_volume() {
        let a = "# HELP loosefs_reads_total Reads.\n# TYPE loosefs_reads_total counter\n\
                 loosefs_reads_total{mountpoint=\"/s/a\"} 3\n\
                 # TYPE loosefs_lat histogram\nloosefs_lat_bucket{le=\"1\"} 1\nloosefs_lat_sum 2\n# EOF\n";
        let b = "# HELP loosefs_reads_total Reads.\n# TYPE loosefs_reads_total counter\n\
                 loosefs_reads_total{mountpoint=\"/s/b\"} 5\nloosefs_up 1\n";
        let got = merge(&[("pv-a".into(), a.into()), ("pv\"b".into(), b.into())]);
        assert_eq!(
            got,
            "# HELP loosefs_reads_total Reads.\n# TYPE loosefs_reads_total counter\n\
             loosefs_reads_total{volume=\"pv-a\",mountpoint=\"/s/a\"} 3\n\
             loosefs_reads_total{volume=\"pv\\\"b\",mountpoint=\"/s/b\"} 5\n\
             # TYPE loosefs_lat histogram\nloosefs_lat_bucket{volume=\"pv-a\",le=\"1\"} 1\n\
             loosefs_lat_sum{volume=\"pv-a\"} 2\n\
             loosefs_up{volume=\"pv\\\"b\"} 1\n"
        );
    }
}
