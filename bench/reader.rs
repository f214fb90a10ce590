//! `loosefs-reader`: the bench's raw reader. Reads every file under a root (or listed in a
//! file) with open/read/close per file — what loaders do per sample — on N threads, in pack
//! order or shuffled, and prints one JSON line: files, bytes, seconds, files/s, MB/s and
//! per-file latency percentiles (µs). Compiled, so Python overhead does not hide the filesystem.
//!
//! Orders: `inorder` (pack order: sorted depth-first), `shuffled` (uniform random), `block`
//! (runs of `--block` consecutive files in random run order, as chunk-shuffling samplers read),
//! `workers` (a DataLoader over an in-order sampler: thread t reads batches t, t+N, t+2N, ... of
//! `--batch` consecutive files, each batch front to back). Threads take files from one shared
//! list, except under `workers`.
//!
//! `--pack PACK` reads the same files' byte ranges straight from a loosefs pack with one `pread`
//! each (the files are found in the pack's index by their path under `--root`): the direct
//! read of the pack that a mount is measured against.
//!
//! `--op decode` instead loads every JPEG into memory first (untimed) and times decoding them
//! to RGB with loosefs' own decoder (turbojpeg) on N threads: the in-process decode rate that
//! the decoded views are measured against.
//!
//! `--share R/N` keeps rank R's share of N ranks (files R, R+N, ...), as DistributedSampler does.
//!
//!     loosefs-reader --root /mnt/set --threads 4 --order shuffled --seed 1

use clap::{Parser, ValueEnum};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, ValueEnum)]
enum Order {
    Inorder,
    Shuffled,
    Block,
    Workers,
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
    /// Files per run under `--order block`.
    #[arg(long, default_value_t = 8)]
    block: usize,
    /// Files per batch under `--order workers`.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Read the files' byte ranges from this pack with `pread` instead of opening them.
    #[arg(long)]
    pack: Option<PathBuf>,
    /// Before reading (inside the timed pass), announce the order to the loosefs mount at
    /// `--root` (`<root>/.loosefs/order`): the order read, or with `--announce-seed` the order
    /// that seed gives (a wrong hint).
    #[arg(long)]
    announce: bool,
    #[arg(long)]
    announce_seed: Option<u64>,
    /// Read only rank R's share of N ranks (`R/N`): files R, R+N, R+2N, ... of the order, as
    /// torch's DistributedSampler splits an epoch (applied before `--limit`).
    #[arg(long, value_name = "R/N", value_parser = parse_share)]
    share: Option<(usize, usize)>,
}

/// `R/N` with R < N.
fn parse_share(s: &str) -> Result<(usize, usize), String> {
    let (r, n) = s.split_once('/').ok_or("give R/N, e.g. 3/8")?;
    let (r, n): (usize, usize) = (
        r.parse().map_err(|_| "R: not a number")?,
        n.parse().map_err(|_| "N: not a number")?,
    );
    if r >= n {
        return Err(format!("rank {r} is not below {n}"));
    }
    Ok((r, n))
}

/// Splitmix64 stream: deterministic for a seed.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    move || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Fisher-Yates shuffle of `v` with `next`.
fn shuffle<T>(v: &mut [T], next: &mut impl FnMut() -> u64) {
    for i in (1..v.len()).rev() {
        v.swap(i, (next() % (i as u64 + 1)) as usize);
    }
}

/// The pack byte range of every file of `files` (paths under `root`), by index lookups.
fn pack_ranges(
    pack: &loosefs::pack::reader::Pack,
    root: &std::path::Path,
    files: &[PathBuf],
) -> Vec<std::ops::Range<u64>> {
    let index = pack.index();
    files
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(root).expect("file under root");
            let mut rec = index.record(0).expect("root record");
            for c in rel.components() {
                let name = c.as_os_str().as_encoded_bytes();
                let k = index
                    .find_child(&rec, name)
                    .unwrap_or_else(|| panic!("{} is not in the pack", rel.display()));
                rec = index.record(k).expect("record");
            }
            pack.data_range(&rec)
                .unwrap_or_else(|| panic!("{} is not a file in the pack", rel.display()))
        })
        .collect()
}

/// Writes the paths of `files` (or of the order `--announce-seed` gives), relative to the
/// root, one per line, to `<root>/.loosefs/order`.
fn announce(a: &Args, files: &[PathBuf]) {
    let mut list = files.to_vec();
    if let Some(seed) = a.announce_seed {
        list.sort();
        shuffle(&mut list, &mut rng(seed));
        list.truncate(files.len());
    }
    let mut text = Vec::new();
    for f in &list {
        use std::os::unix::ffi::OsStrExt;
        text.extend_from_slice(f.strip_prefix(&a.root).unwrap_or(f).as_os_str().as_bytes());
        text.push(b'\n');
    }
    let p = a.root.join(".loosefs/order");
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
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
    let mut next_rand = rng(a.seed);
    match a.order {
        Order::Shuffled => shuffle(&mut files, &mut next_rand),
        Order::Block => {
            let mut runs: Vec<Vec<PathBuf>> =
                files.chunks(a.block.max(1)).map(|c| c.to_vec()).collect();
            shuffle(&mut runs, &mut next_rand);
            files = runs.into_iter().flatten().collect();
        }
        Order::Inorder | Order::Workers => {}
    }
    if let Some((r, n)) = a.share {
        files = files.into_iter().skip(r).step_by(n).collect();
    }
    if a.limit > 0 {
        files.truncate(a.limit);
    }
    let jpegs: Vec<(Vec<u8>, u32, u32)> = match a.op {
        Op::Decode => files
            .iter()
            .filter_map(|p| {
                let b = std::fs::read(p).ok()?;
                let i = loosefs::pack::jpeg::probe(&b)?;
                Some((b, i.width, i.height))
            })
            .collect(),
        _ => Vec::new(),
    };
    if let Op::Decode = a.op {
        files.truncate(jpegs.len());
    }
    let threads = a.threads.max(1);
    // The list each thread reads, in turn (shared by all but under `workers`).
    let lists: Vec<Vec<usize>> = match a.order {
        Order::Workers => {
            let batch = a.batch.max(1);
            (0..threads)
                .map(|t| {
                    (0..files.len())
                        .filter(|i| (i / batch) % threads == t)
                        .collect()
                })
                .collect()
        }
        _ => vec![(0..files.len()).collect()],
    };
    let ranges = a.pack.as_ref().map(|p| {
        let pack =
            loosefs::pack::reader::Pack::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (
            pack_ranges(&pack, &a.root, &files),
            std::fs::File::open(p).expect("pack"),
        )
    });
    let cursors: Vec<AtomicUsize> = (0..lists.len()).map(|_| AtomicUsize::new(0)).collect();
    let t0 = Instant::now();
    if a.announce {
        announce(&a, &files);
    }
    let results: Vec<(u64, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (lists, cursors, files, jpegs, ranges) =
                    (&lists, &cursors, &files, &jpegs, &ranges);
                let (list, cursor) = (&lists[t % lists.len()], &cursors[t % lists.len()]);
                let op = a.op;
                s.spawn(move || {
                    let mut bytes = 0u64;
                    let mut lat = Vec::new();
                    let mut buf = Vec::with_capacity(1 << 20);
                    loop {
                        let k = cursor.fetch_add(1, Ordering::Relaxed);
                        let Some(&i) = list.get(k) else { break };
                        let p = &files[i];
                        let t = Instant::now();
                        let n = match op {
                            Op::Read if ranges.is_some() => {
                                let (r, f) = ranges.as_ref().map(|(r, f)| (&r[i], f)).unwrap();
                                buf.resize((r.end - r.start) as usize, 0);
                                f.read_exact_at(&mut buf, r.start)
                                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                                buf.len()
                            }
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
            "order": match a.order {
                Order::Inorder => "inorder", Order::Shuffled => "shuffled",
                Order::Block => "block", Order::Workers => "workers",
            },
            "block": a.block, "batch": a.batch, "pread": a.pack.is_some(),
            "op": match a.op { Op::Read => "read", Op::Stat => "stat", Op::Decode => "decode" },
        })
    );
}
