//! `loosefs-reader`: the bench's raw reader. Reads every file under a root (or listed in a
//! file) with open/read/close per file — what loaders do per sample — on N threads, in pack
//! order or shuffled, and prints one JSON line: files, bytes, seconds, files/s, MB/s and
//! per-file latency percentiles (µs). Compiled, so Python overhead does not hide the filesystem.
//!
//! `--op decode` instead loads every JPEG into memory first (untimed) and times decoding them
//! to RGB with loosefs' own decoder (turbojpeg) on N threads: the in-process decode rate that
//! the decoded views are measured against.
//!
//!     loosefs-reader --root /mnt/set --threads 4 --order shuffled --seed 1

use clap::{Parser, ValueEnum};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, ValueEnum)]
enum Order {
    Inorder,
    Shuffled,
}

#[derive(Clone, Copy, ValueEnum)]
enum Op {
    Read,
    Stat,
    Decode,
}

#[derive(Parser)]
#[command(about = "Read every file of a tree with open/read/close, N threads; print JSON")]
struct Args {
    /// Directory to read (files in sorted depth-first order, i.e. pack order).
    #[arg(long)]
    root: PathBuf,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, value_enum, default_value = "inorder")]
    order: Order,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// What to do per file: read it whole, or only stat it.
    #[arg(long, value_enum, default_value = "read")]
    op: Op,
    /// Read at most this many files (0 = all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
}

fn main() {
    let a = Args::parse();
    let mut files: Vec<PathBuf> = walkdir::WalkDir::new(&a.root)
        .sort_by_file_name()
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect();
    if let Order::Shuffled = a.order {
        // Fisher-Yates with a splitmix64 stream: deterministic for a seed.
        let mut x = a.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for i in (1..files.len()).rev() {
            files.swap(i, (next() % (i as u64 + 1)) as usize);
        }
    }
    if a.limit > 0 {
        files.truncate(a.limit);
    }
    let jpegs: Vec<(Vec<u8>, u32, u32)> = match a.op {
        Op::Decode => files
            .iter()
            .filter_map(|p| {
                let b = std::fs::read(p).ok()?;
                let i = loosefs::format::jpeg::probe(&b)?;
                Some((b, i.width, i.height))
            })
            .collect(),
        _ => Vec::new(),
    };
    if let Op::Decode = a.op {
        files.truncate(jpegs.len());
    }
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let results: Vec<(u64, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut bytes = 0u64;
                    let mut lat = Vec::new();
                    let mut buf = Vec::with_capacity(1 << 20);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(p) = files.get(i) else { break };
                        let t = Instant::now();
                        let n = match a.op {
                            Op::Read => {
                                buf.clear();
                                let mut f = std::fs::File::open(p)
                                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                                f.read_to_end(&mut buf)
                                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                            }
                            Op::Decode => {
                                let (b, w, h) = &jpegs[i];
                                loosefs::decode::codec::decode_rgb(b, 1, *w, *h)
                                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                                    .pixels
                                    .len()
                            }
                            Op::Stat => std::fs::metadata(p)
                                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                                .len() as usize,
                        };
                        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        bytes += n as u64;
                    }
                    (bytes, lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let bytes: u64 = results.iter().map(|r| r.0).sum();
    let mut lat: Vec<u32> = results.into_iter().flat_map(|r| r.1).collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{}",
        serde_json::json!({
            "files": lat.len(), "bytes": bytes, "seconds": secs,
            "files_per_s": lat.len() as f64 / secs, "mb_per_s": bytes as f64 / 1e6 / secs,
            "p50_us": pct(0.5), "p95_us": pct(0.95), "p99_us": pct(0.99), "threads": a.threads,
            "order": match a.order { Order::Inorder => "inorder", Order::Shuffled => "shuffled" },
            "op": match a.op { Op::Read => "read", Op::Stat => "stat", Op::Decode => "decode" },
        })
    );
}
