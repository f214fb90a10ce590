//! The `loosefs` command line: parses arguments (clap) and calls the library.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use loosefs::format::reader::Pack;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "loosefs",
    version,
    about = "Mount a packed ML dataset so unmodified loaders see ordinary files"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// A decoded view (`--decode`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ViewArg {
    /// `x.npy` beside every JPEG `x.JPEG`: NumPy .npy v1.0, uint8, shape (H, W, 3).
    Npy,
    /// `x.JPEG` itself serves a binary PPM (P6) of its RGB pixels.
    Ppm,
}

/// Decoded views of the JPEG samples.
#[derive(Args)]
struct DecodeArgs {
    /// Serve decoded views of every JPEG: `npy`, `ppm`, or both (`--decode npy,ppm`).
    #[arg(long, value_enum, value_delimiter = ',')]
    decode: Vec<ViewArg>,
    /// With `--decode npy`: list only the `.npy` views, not the JPEGs.
    #[arg(long)]
    decoded_only: bool,
    /// Decode at the smallest DCT scale (1/2, 1/4, 1/8) whose longer side is still ≥ N pixels.
    #[arg(long, value_name = "N")]
    decode_max_side: Option<u32>,
    /// Budget of the decoded cache (bytes of pixels, least recently used evicted), e.g. 2G.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_budget)]
    decode_cache: u64,
    /// Decode threads (default: one per core).
    #[arg(long, value_name = "N")]
    decode_threads: Option<usize>,
    /// JPEGs decoded ahead of a reader that walks the pack in order (0 disables).
    #[arg(long, value_name = "N", default_value_t = 8)]
    decode_ahead: usize,
}

impl DecodeArgs {
    fn views(&self) -> Result<loosefs::decode::view::Views> {
        let v = loosefs::decode::view::Views {
            npy: self.decode.contains(&ViewArg::Npy),
            ppm: self.decode.contains(&ViewArg::Ppm),
            decoded_only: self.decoded_only,
            max_side: self.decode_max_side,
        };
        if v.decoded_only && !v.npy {
            anyhow::bail!(
                "--decoded-only needs --decode npy (a PPM view already replaces the JPEG)"
            );
        }
        if v.max_side.is_some() && !v.any() {
            anyhow::bail!("--decode-max-side needs --decode npy or --decode ppm");
        }
        if v.max_side == Some(0) {
            anyhow::bail!("--decode-max-side must be at least 1");
        }
        Ok(v)
    }

    fn options(&self) -> loosefs::decode::DecodeOptions {
        loosefs::decode::DecodeOptions {
            cache_bytes: self.decode_cache,
            threads: self
                .decode_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            ahead: self.decode_ahead,
        }
    }
}

fn parse_budget(s: &str) -> Result<u64, String> {
    loosefs::pagecache::parse_size(s)?.ok_or_else(|| "give a size such as 512M or 2G".into())
}

#[derive(Subcommand)]
enum Cmd {
    /// Pack a directory tree (or convert a zip archive) into one pack (ZIP64, stored,
    /// page-aligned, plus an index).
    ///
    /// Example: loosefs pack ~/data/imagenet/train train.pack
    Pack {
        /// Source directory (an ImageFolder tree, or any tree of files), or a zip archive.
        src: PathBuf,
        /// Output pack; written to a temp file beside it and renamed when complete.
        out: PathBuf,
        /// Reader threads (default: number of CPUs).
        #[arg(long, short = 'j', default_value_t = 0)]
        jobs: usize,
        /// Alignment of each sample's data in bytes: a power of two from 1 to 32768.
        #[arg(long, default_value_t = loosefs::format::DEFAULT_ALIGN)]
        align: u32,
        /// Follow symbolic links (default: report and skip them).
        #[arg(long)]
        follow_links: bool,
        /// Replace OUT if it exists.
        #[arg(long)]
        force: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mount a pack read-only; returns once the mount is ready, the daemon staying in the
    /// background.
    ///
    /// Example: loosefs mount train.pack /mnt/train
    Mount {
        pack: PathBuf,
        mountpoint: PathBuf,
        /// Serve in the foreground instead of starting a daemon.
        #[arg(long, short = 'f')]
        foreground: bool,
        /// FUSE worker threads. A thread waiting for the disk serves nothing else, so this caps
        /// the reads in flight on a cold pack.
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// Kernel read-ahead for this mount in KiB (0 keeps the kernel default of 128). Measured
        /// on the ImageNet sample, cold, 1 reader, 5 runs: 1024 gave +33% in order but -25%
        /// shuffled (one READ per sample instead of two in parallel), so the default is 0.
        #[arg(long, default_value_t = 0)]
        read_ahead_kb: u32,
        /// Log file of the background daemon (default: discarded). Level from RUST_LOG.
        #[arg(long)]
        log: Option<PathBuf>,
        /// Largest read-ahead window in pack order, MiB (0 disables read-ahead across samples).
        #[arg(long, default_value_t = 64)]
        prefetch_max_mb: u64,
        /// Keep this much of the pack resident (mlock), from its start: a size such as 2G or
        /// 512M, or `all`. Refused when it does not fit in available memory or the cgroup limit.
        #[arg(long, value_parser = parse_pin)]
        pin: Option<u64>,
        /// Stream the whole pack into the page cache in the background after mounting.
        #[arg(long)]
        warm: bool,
        /// Keep a sample's pack pages cached after serving it. By default they are dropped: the
        /// mount's own page cache holds the same bytes, and keeping both caches them twice.
        #[arg(long)]
        keep_pack_cache: bool,
        /// While a reader walks the pack in order, push this many following samples into the
        /// kernel's page cache ahead of it (FUSE_NOTIFY_STORE), so their reads need no round
        /// trip to the daemon. 0 disables.
        #[arg(long, default_value_t = 64)]
        push_ahead: usize,
        #[command(flatten)]
        decode: DecodeArgs,
    },
    /// Print a mount's statistics (requests, bytes, page-cache and read-ahead hits, pinned
    /// bytes, warm progress, latency percentiles).
    ///
    /// Example: loosefs stats /mnt/train --json
    Stats {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Start streaming the whole pack into the page cache (see `stats` for progress).
    ///
    /// Example: loosefs warm /mnt/train --wait
    Warm {
        mountpoint: PathBuf,
        /// Wait until the warm is done, printing progress.
        #[arg(long)]
        wait: bool,
    },
    /// Empty every cache the daemon owns and evict the pack's unpinned pages, so the next read
    /// is cold (pair it with `echo 3 > /proc/sys/vm/drop_caches` for the rest of the system).
    ///
    /// Example: loosefs drop-cache /mnt/train
    DropCache { mountpoint: PathBuf },
    /// Unmount a loosefs mount (also stale ones left by a killed daemon).
    ///
    /// Example: loosefs umount /mnt/train
    Umount {
        mountpoint: PathBuf,
        /// Detach a busy mount now; it goes away when the last user leaves.
        #[arg(long)]
        lazy: bool,
    },
    /// Summarise a pack: samples, directories, bytes, alignment, index version, JPEG counts.
    ///
    /// Example: loosefs info train.pack --json
    Info {
        pack: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Check every sample's CRC-32 (and every byte against the source tree when given);
    /// exits 1 naming each mismatch.
    ///
    /// Example: loosefs verify train.pack --against ~/data/imagenet/train
    Verify {
        pack: PathBuf,
        #[arg(long)]
        against: Option<PathBuf>,
    },
}

fn parse_pin(s: &str) -> Result<u64, String> {
    Ok(loosefs::pagecache::parse_size(s)?.unwrap_or(u64::MAX))
}

fn open(pack: &std::path::Path) -> Result<Pack> {
    Pack::open(pack).with_context(|| format!("cannot open pack {}", pack.display()))
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Pack {
            src,
            out,
            jobs,
            align,
            follow_links,
            force,
            json,
        } => {
            let opts = loosefs::packer::PackOptions {
                jobs,
                align,
                follow_links,
                force,
                progress: !json,
            };
            let r = loosefs::packer::pack_dir(&src, &out, &opts)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (p, why) in &r.skipped {
                    eprintln!("skipped {}: {why}", p.display());
                }
                println!(
                    "packed {} files ({} JPEG) and {} directories, {:.1} MB, into {} ({:.1} MB) in {:.2} s ({:.0} files/s, {:.0} MB/s)",
                    r.files,
                    r.jpegs,
                    r.dirs,
                    r.bytes as f64 / 1e6,
                    out.display(),
                    r.pack_bytes as f64 / 1e6,
                    r.seconds,
                    r.files as f64 / r.seconds,
                    r.bytes as f64 / 1e6 / r.seconds
                );
            }
        }
        Cmd::Mount {
            pack,
            mountpoint,
            foreground,
            threads,
            read_ahead_kb,
            log,
            prefetch_max_mb,
            pin,
            warm,
            keep_pack_cache,
            push_ahead,
            decode,
        } => {
            let opts = loosefs::mount::MountOptions {
                foreground,
                threads,
                read_ahead_kb,
                log,
                prefetch_max_mb,
                pin,
                warm,
                keep_pack_cache,
                push_ahead,
                views: decode.views()?,
                decode: decode.options(),
            };
            loosefs::mount::mount(&pack, &mountpoint, &opts)?;
        }
        Cmd::Stats { mountpoint, json } => {
            let v = loosefs::client::read_control(&mountpoint, "stats")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", loosefs::client::format_stats(&v));
            }
        }
        Cmd::Warm { mountpoint, wait } => {
            let v = loosefs::client::read_control(&mountpoint, "warm")?;
            if !wait {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                loosefs::client::wait_warm(&mountpoint)?;
            }
        }
        Cmd::DropCache { mountpoint } => {
            let v = loosefs::client::read_control(&mountpoint, "drop-cache")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Cmd::Umount { mountpoint, lazy } => loosefs::mount::unmount(&mountpoint, lazy)?,
        Cmd::Info { pack, json } => {
            let i = loosefs::verify::info(&open(&pack)?);
            if json {
                println!("{}", serde_json::to_string_pretty(&i)?);
            } else {
                println!("pack:          {} ({} bytes)", i.pack, i.pack_bytes);
                println!("index version: {}", i.index_version);
                println!(
                    "samples:       {} ({} JPEG, {} other)",
                    i.samples, i.jpeg_files, i.other_files
                );
                println!("directories:   {} (root included)", i.directories);
                println!("sample bytes:  {}", i.sample_bytes);
                println!("alignment:     {} bytes", i.alignment);
            }
        }
        Cmd::Verify { pack, against } => {
            let p = open(&pack)?;
            let problems = loosefs::verify::verify(&p, against.as_deref())?;
            for line in &problems {
                println!("MISMATCH {line}");
            }
            if !problems.is_empty() {
                eprintln!("{}: {} problem(s)", pack.display(), problems.len());
                return Ok(1);
            }
            println!(
                "{}: {} samples OK{}",
                pack.display(),
                p.totals().files,
                if against.is_some() {
                    ", identical to the source"
                } else {
                    ""
                }
            );
        }
    }
    Ok(0)
}

fn main() {
    // fuser warns when the mount it tracks was already unmounted by us or by `umount`: noise.
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Warn)
        .filter_module("fuser::mnt", log::LevelFilter::Error)
        .parse_env("RUST_LOG")
        .init();
    match run(Cli::parse()) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("loosefs: error: {e:#}");
            std::process::exit(2);
        }
    }
}
