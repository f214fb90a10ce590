//! Client side of the control directory: what `loosefs stats`, `warm` and `drop-cache` do. They
//! read `<mnt>/.loosefs/<name>` (one lookup runs the command) into the typed reports of
//! [`crate::report`].

use crate::progress::{Meter, Progress, Unit};
use crate::report::{Report, WarmState};
use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::time::Duration;

/// Reads control file `name` of the loosefs mount at `mnt` as a `T`.
///
/// Errors: `mnt` is not a loosefs mount (no control directory), or the content is not a `T`.
pub fn read_control<T: DeserializeOwned>(mnt: &Path, name: &str) -> Result<T> {
    let p = mnt.join(".loosefs").join(name);
    let bytes = std::fs::read(&p)
        .map_err(|e| anyhow::anyhow!(crate::mount_table::why_no_answer(mnt, &e)))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a report this loosefs understands", p.display()))
}

/// Human-readable summary of a stats report.
pub fn format_stats(r: &Report) -> String {
    let mb = |x: u64| x as f64 / 1e6;
    let mut out = String::new();
    out += &format!(
        "pack        {} ({:.1} MB, {} samples, {:.1} MB resident, reads by {})\n",
        r.pack.path,
        mb(r.pack.bytes),
        r.pack.samples,
        mb(r.pack.resident_bytes),
        r.pack.reads
    );
    let d = &r.daemon;
    out += &format!(
        "daemon      pid {}, up {:.0} s, RSS {:.1} MB (peak {:.1}), locked {:.1} MB, {} threads, log {}\n",
        d.pid,
        d.uptime_s,
        mb(d.rss_bytes),
        mb(d.rss_peak_bytes),
        mb(d.locked_bytes),
        d.threads,
        if d.log == "-" { "on stderr" } else { &d.log }
    );
    let t = &d.transport;
    if !t.kind.is_empty() {
        out += &match t.kind.as_str() {
            "uring" => format!(
                "transport   FUSE over io_uring ({} queues, {} ring threads, {} requests through the ring)\n",
                t.queues, t.ring_threads, t.ring_requests
            ),
            "classic" => "transport   /dev/fuse (classic reads and writes)\n".to_string(),
            other => format!("transport   {other}\n"),
        };
    }
    if !d.version.is_empty() {
        out += &match &d.keeper {
            Some(k) if k.restarts > 0 => format!(
                "kept        by keeper pid {}, {} restarts (the last daemon: {}); loosefs {}\n",
                k.pid, k.restarts, k.last_end, d.version
            ),
            Some(k) => format!(
                "kept        by keeper pid {}; loosefs {}\n",
                k.pid, d.version
            ),
            None => format!(
                "kept        no (the mount ends with this daemon); loosefs {}\n",
                d.version
            ),
        };
    }
    out += &format!(
        "served      {:.1} MB, {} errors{}\n",
        mb(r.bytes_served),
        r.errors,
        if r.stale > 0 {
            format!(
                " ({} ESTALE: a remote object was replaced; mount again)",
                r.stale
            )
        } else {
            String::new()
        }
    );
    out += &format!(
        "page cache  {} hits, {} misses\n",
        r.page_cache.hits, r.page_cache.misses
    );
    out += &format!(
        "read-ahead  {} requests, {:.1} MB: {:.1} MB served, {:.1} MB not (yet); {} hits\n",
        r.prefetch.requests,
        mb(r.prefetch.bytes),
        mb(r.prefetch.served_bytes),
        mb(r.prefetch.unserved_bytes),
        r.prefetch.hits
    );
    out += &format!(
        "push-ahead  {} samples, {:.1} MB, {} resets\n",
        r.push_ahead.samples,
        mb(r.push_ahead.bytes),
        r.push_ahead.resets
    );
    out += &format!(
        "pinned      {:.1} of {:.1} MB\n",
        mb(r.pin.pinned_bytes),
        mb(r.pin.target_bytes)
    );
    if let Some(x) = &r.remote {
        out += &format!(
            "remote      {} GETs ({} failed), {:.1} MB received; blocks {} fetched, {} evicted, {} damaged; cache {:.1} of {:.1} MB in {}\n",
            x.gets,
            x.failed_gets,
            mb(x.bytes_received),
            x.blocks_fetched,
            x.blocks_evicted,
            x.blocks_damaged,
            mb(x.cached_bytes),
            mb(x.cache_limit_bytes),
            x.cache_dir
        );
        if x.exact_gets > 0 || x.exact_held_bytes > 0 {
            out += &format!(
                "exact       {} GETs of sample ranges, {:.1} MB received, {:.1} MB served from them, {:.1} MB held\n",
                x.exact_gets,
                mb(x.exact_bytes_received),
                mb(x.exact_bytes_served),
                mb(x.exact_held_bytes)
            );
        }
    }
    if let Some(f) = &r.frames {
        out += &format!(
            "frames      {} GOPs decoded ({} frames, {} failed, {} ahead) by {} threads, {} hits, {} misses, {} joined; {:.1} of {:.1} MB cached\n",
            f.gops,
            f.frames,
            f.failures,
            f.ahead,
            f.threads,
            f.hits,
            f.misses,
            f.joined,
            mb(f.cached_bytes),
            mb(f.budget_bytes)
        );
    }
    if let Some(d) = &r.decode {
        out += &format!(
            "decode      {} decodes ({} fallback, {} with warnings, {} failed reads, {} damaged refused), {} hits, {} joined, {} ahead; p50 {} µs, p99 {} µs\n",
            d.decodes,
            d.fallback_decodes,
            d.warning_decodes,
            d.failures,
            d.damaged_refused,
            d.hits,
            d.joined,
            d.decoded_ahead,
            d.decode_us.p50_us,
            d.decode_us.p99_us
        );
        out += &format!(
            "decoded     {:.1} of {:.1} MB cached, {} images, {} evictions\n",
            mb(d.cache.bytes),
            mb(d.cache.budget_bytes),
            d.cache.entries,
            d.cache.evictions
        );
    }
    let w = &r.warm;
    out += &format!(
        "warm        {} {:.1}/{:.1} MB at {:.0} MB/s\n",
        w.state.as_str(),
        mb(w.bytes_done),
        mb(w.bytes_total),
        w.mb_per_s
    );
    out += "latency µs  op        count      p50      p90      p99      max\n";
    for (op, l) in &r.latency_us {
        out += &format!(
            "            {op:8} {:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1}\n",
            l.count, l.p50_us, l.p90_us, l.p99_us, l.max_us
        );
    }
    out
}

/// Shows the progress of the pin and the warm of the mount at `mnt` until both are complete
/// (`loosefs mount --wait`, `loosefs warm --wait`): `pin` and `warm` say which to wait for,
/// `progress` how to show them (bars of bytes with their rate and ETA on a terminal, JSON
/// lines, or only the closing line).
///
/// Errors: the mount cannot be read, the pin stopped short (no progress for 60 s; the daemon
/// logged why), or the warm failed.
pub fn wait_pin_and_warm(mnt: &Path, pin: bool, warm: bool, progress: Progress) -> Result<()> {
    let mut last = u64::MAX;
    let mut moved = std::time::Instant::now();
    let bars = progress.group();
    let pin_bar = pin.then(|| bars.meter("pin", Unit::Bytes, Some(0)));
    let warm_bar = warm.then(|| bars.meter("warm", Unit::Bytes, Some(0)));
    let ends = |end: fn(&Meter)| pin_bar.iter().chain(&warm_bar).for_each(end);
    loop {
        let r = read_control::<Report>(mnt, "stats")?;
        let (p, w) = (&r.pin, &r.warm);
        let pin_done = !pin || p.pinned_bytes >= p.target_bytes;
        for (bar, done, total) in [
            (&pin_bar, p.pinned_bytes, p.target_bytes),
            (&warm_bar, w.bytes_done, w.bytes_total),
        ] {
            if let Some(b) = bar {
                b.set_total(total);
                b.set(done.min(total));
            }
        }
        let done = pin_done && (!warm || w.state == WarmState::Done);
        if warm && w.state == WarmState::Failed {
            ends(Meter::abandon);
            anyhow::bail!("the warm failed; see the daemon log");
        }
        if done {
            ends(Meter::finish);
            let mut line = Vec::new();
            if pin {
                line.push(format!("pinned {:.1} MB", p.pinned_bytes as f64 / 1e6));
            }
            if warm {
                line.push(format!(
                    "warmed {:.1} MB ({:.0} MB/s)",
                    w.bytes_done as f64 / 1e6,
                    w.mb_per_s
                ));
            }
            // A log or a pipe gets this line and no bars.
            progress.note(&line.join("; "));
            return Ok(());
        }
        if pin_done || p.pinned_bytes != last {
            moved = std::time::Instant::now();
        }
        if moved.elapsed() >= Duration::from_secs(60) {
            ends(Meter::abandon);
            anyhow::bail!(
                "the pin stopped at {} of {} bytes; see the daemon log",
                p.pinned_bytes,
                p.target_bytes
            );
        }
        last = p.pinned_bytes;
        // Polled every 20 ms, so `--wait` returns as soon as it is done.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a warm if none is running and prints progress until it is done.
///
/// Errors: the mount cannot be read, or the warm failed.
pub fn wait_warm(mnt: &Path) -> Result<()> {
    wait_pin_and_warm(mnt, false, true, Progress::Bar)
}

/// A drop-cache report as text: what was cached before and after, what pins kept, how many
/// files the kernel forgot, and why eviction failed if it did.
pub fn format_drop_cache(r: &crate::report::DropCacheReport) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    let mut out = format!(
        "cached bytes of the source: {:.1} MB before, {:.1} MB after ({:.1} MB pinned stay)\n\
         files whose pages the kernel dropped: {}\n",
        mb(r.pack_resident_bytes_before),
        mb(r.pack_resident_bytes_after),
        mb(r.pinned_bytes),
        r.inodes_invalidated
    );
    if let Some(e) = &r.error {
        out += &format!("eviction failed: {e}\n");
    }
    out
}
