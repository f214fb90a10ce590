//! Client side of the control directory: what `loosefs stats`, `warm` and `drop-cache` do. They
//! read `<mnt>/.loosefs/<name>` (one lookup runs the command) and parse its JSON.

use anyhow::{Context, Result};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Reads and parses control file `name` of the loosefs mount at `mnt`.
///
/// Errors: `mnt` is not a loosefs mount (no control directory), or the content is not JSON.
pub fn read_control(mnt: &Path, name: &str) -> Result<Value> {
    let p = mnt.join(".loosefs").join(name);
    let bytes = std::fs::read(&p).with_context(|| {
        format!(
            "cannot read {} (is {} a loosefs mount?)",
            p.display(),
            mnt.display()
        )
    })?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", p.display()))
}

/// Human-readable summary of a stats report.
pub fn format_stats(v: &Value) -> String {
    let mut out = String::new();
    let g = |path: &[&str]| -> &Value { path.iter().fold(v, |v, k| &v[*k]) };
    let mb = |x: &Value| x.as_f64().unwrap_or(0.0) / 1e6;
    out += &format!(
        "pack        {} ({:.1} MB, {} samples, {:.1} MB resident)\n",
        g(&["pack", "path"]).as_str().unwrap_or("?"),
        mb(g(&["pack", "bytes"])),
        g(&["pack", "samples"]),
        mb(g(&["pack", "resident_bytes"]))
    );
    out += &format!(
        "daemon      pid {}, up {:.0} s, RSS {:.1} MB (peak {:.1}), locked {:.1} MB, {} threads\n",
        g(&["daemon", "pid"]),
        g(&["daemon", "uptime_s"]).as_f64().unwrap_or(0.0),
        mb(g(&["daemon", "rss_bytes"])),
        mb(g(&["daemon", "rss_peak_bytes"])),
        mb(g(&["daemon", "locked_bytes"])),
        g(&["daemon", "threads"])
    );
    out += &format!(
        "served      {:.1} MB, {} errors\n",
        mb(g(&["bytes_served"])),
        g(&["errors"])
    );
    out += &format!(
        "page cache  {} hits, {} misses\n",
        g(&["page_cache", "hits"]),
        g(&["page_cache", "misses"])
    );
    out += &format!(
        "read-ahead  {} requests, {:.1} MB, {} hits\n",
        g(&["prefetch", "requests"]),
        mb(g(&["prefetch", "bytes"])),
        g(&["prefetch", "hits"])
    );
    out += &format!(
        "pinned      {:.1} of {:.1} MB\n",
        mb(g(&["pin", "pinned_bytes"])),
        mb(g(&["pin", "target_bytes"]))
    );
    let d = g(&["decode"]);
    if !d.is_null() {
        out += &format!(
            "decode      {} decodes ({} fallback, {} with warnings, {} failed), {} hits, {} joined, {} ahead; p50 {} µs, p99 {} µs\n",
            d["decodes"],
            d["fallback_decodes"],
            d["warning_decodes"],
            d["failures"],
            d["hits"],
            d["joined"],
            d["decoded_ahead"],
            d["decode_us"]["p50_us"],
            d["decode_us"]["p99_us"]
        );
        out += &format!(
            "decoded     {:.1} of {:.1} MB cached, {} images, {} evictions\n",
            mb(&d["cache"]["bytes"]),
            mb(&d["cache"]["budget_bytes"]),
            d["cache"]["entries"],
            d["cache"]["evictions"]
        );
    }
    out += &format!(
        "warm        {} {:.1}/{:.1} MB at {:.0} MB/s\n",
        g(&["warm", "state"]).as_str().unwrap_or("?"),
        mb(g(&["warm", "bytes_done"])),
        mb(g(&["warm", "bytes_total"])),
        g(&["warm", "mb_per_s"]).as_f64().unwrap_or(0.0)
    );
    out += "latency µs  op        count      p50      p90      p99      max\n";
    if let Some(m) = g(&["latency_us"]).as_object() {
        for (op, l) in m {
            let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
            out += &format!(
                "            {op:8} {:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1}\n",
                l["count"],
                f("p50_us"),
                f("p90_us"),
                f("p99_us"),
                f("max_us")
            );
        }
    }
    out
}

/// Starts a warm if none is running and prints progress until it is done.
pub fn wait_warm(mnt: &Path) -> Result<()> {
    loop {
        let v = read_control(mnt, "stats")?;
        let w = &v["warm"];
        let state = w["state"].as_str().unwrap_or("?").to_string();
        eprintln!(
            "warm: {state} {:.1}/{:.1} MB ({:.0} MB/s)",
            w["bytes_done"].as_f64().unwrap_or(0.0) / 1e6,
            w["bytes_total"].as_f64().unwrap_or(0.0) / 1e6,
            w["mb_per_s"].as_f64().unwrap_or(0.0)
        );
        match state.as_str() {
            "done" => return Ok(()),
            "failed" => anyhow::bail!("the warm failed; see the daemon log"),
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}
