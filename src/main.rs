//! The `loosefs` command line: parses arguments (clap) and calls the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use loosefs::pack::reader::Pack;
use loosefs::progress::Progress;
use std::path::PathBuf;

/// Writes a line to the standard output. A reader that went away (`| head`) ends nothing: the
/// line is dropped. Errors: any other write failure (a full disk), with what failed.
fn write_out(line: std::fmt::Arguments) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to the standard output")
        }
        _ => Ok(()),
    }
}

/// `println!` through [`write_out`]: `outln!(...)?`.
macro_rules! outln {
    ($($t:tt)*) => {
        write_out(format_args!($($t)*))
    };
}

#[derive(Parser)]
#[command(
    name = "loosefs",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LOOSEFS_COMMIT"), ")"),
    about = "Mount a packed ML dataset so unmodified loaders see ordinary files"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pack a directory tree (or convert a zip archive, or a dataset in another packed
    /// format: the tree its mount shows) into one pack (ZIP64, stored, aligned, plus an
    /// index).
    ///
    /// Example: loosefs pack ~/data/imagenet/train train.pack; loosefs pack shards/ train.pack
    Pack(PackCmd),
    /// Mount a pack read-only; returns once the mount is ready, the daemon staying in the
    /// background. Also mounts datasets in other packed formats (WebDataset/tar, zip,
    /// TFRecord, MDS, LitData, GulpIO, FFCV) as ImageFolder trees, indexed once.
    ///
    /// Example: loosefs mount train.pack /mnt/train; loosefs mount shards/ /mnt/train
    Mount {
        /// The dataset: a pack, a directory, a dataset in another format, or a URL of one
        /// (s3://, gs://, az://, https://; or of a prefix or directory of loose files).
        #[arg(value_name = "SOURCE")]
        pack: PathBuf,
        /// An empty directory to mount on, or /dev/fd/N: a FUSE connection handed over as
        /// descriptor N (see `loosefs fuse-fd`).
        mountpoint: PathBuf,
        #[command(flatten)]
        opts: loosefs::options::MountArgs,
    },
    /// Index a dataset in another packed format once for every node: writes a shared index
    /// beside it (`<SRC>.loosefs-index`, an object in a bucket, or `--out`) that a mount on
    /// any machine uses instead of scanning the dataset, while every file keeps its size and
    /// mtime, every object its ETag (a stale index is refused, naming the file that changed).
    ///
    /// Example: loosefs index /nfs/imagenet-wds; loosefs index s3://bucket/imagenet-mds/
    Index {
        /// The dataset in another packed format to index: a directory, or a URL of one (s3://,
        /// gs://, az://, https://; or of a prefix or directory of loose files).
        source: PathBuf,
        /// Where to write it (default `<SOURCE>.loosefs-index`): a path or a bucket URL (s3://, gs://, az://).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Progress for programs that wrap `loosefs index` (the Python package's tqdm bars):
        /// one JSON object per line on stderr instead of the terminal's bars, at most five a
        /// second per step, `{"progress": {"step": "index", "unit": "samples", "done": N,
        /// "total": N}}`, and `{"note": "..."}` for what a terminal shows as `loosefs: ...`.
        #[arg(long)]
        progress_lines: bool,
        #[command(flatten)]
        args: loosefs::options::SourceArgs,
    },
    /// Print a mount's statistics (requests, bytes, page-cache and read-ahead hits, pinned
    /// bytes, warm progress, latency percentiles).
    ///
    /// Example: loosefs stats /mnt/train --json
    Stats {
        /// A loosefs mount's mountpoint.
        mountpoint: PathBuf,
        /// `text` (a table), `json` (the report `<mnt>/.loosefs/stats` holds), `prometheus`
        /// (Prometheus text, as `<mnt>/.loosefs/metrics` holds: for node_exporter's textfile
        /// collector, `loosefs stats MNT --format prometheus > DIR/loosefs.prom.tmp && mv ...`)
        /// or `openmetrics` (the same families as OpenMetrics text).
        #[arg(long, value_enum, default_value = "text")]
        format: StatsFormat,
        /// Same as `--format json`.
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// Same as `--format prometheus`.
        #[arg(long, conflicts_with_all = ["format", "json"])]
        prometheus: bool,
    },
    /// Start streaming the whole pack into the page cache (see `stats` for progress).
    ///
    /// Example: loosefs warm /mnt/train --wait
    Warm {
        /// A loosefs mount's mountpoint.
        mountpoint: PathBuf,
        /// Wait until the warm is done, printing progress.
        #[arg(long)]
        wait: bool,
    },
    /// Empty every cache the daemon owns and evict the pack's unpinned pages, so the next read
    /// is cold (pair it with `echo 3 > /proc/sys/vm/drop_caches` for the rest of the system).
    ///
    /// Example: loosefs drop-cache /mnt/train
    DropCache {
        /// A loosefs mount's mountpoint.
        mountpoint: PathBuf,
        /// Print the report as JSON (what `<mnt>/.loosefs/drop-cache` holds).
        #[arg(long)]
        json: bool,
    },
    /// Swap in a new daemon for a kept mount without unmounting it: the mount's keeper starts
    /// the daemon again from the same executable path (an upgraded binary, if one was
    /// installed there), waits until it serves, then stops the old one; readers see a pause,
    /// no error. Prints the new daemon's pid and version.
    ///
    /// Example: loosefs restart /mnt/train
    Restart {
        /// A kept loosefs mount's mountpoint (mounted in the background, the default).
        mountpoint: PathBuf,
    },
    /// The keeper of a mount (started by its first daemon; not for use by hand): holds the
    /// FUSE connection on fd 3 and starts a new daemon when one dies.
    #[command(hide = true)]
    Keep {
        /// What the kernel offered at FUSE_INIT (`7.MINOR:FLAGS:READAHEAD`).
        #[arg(long)]
        offer: String,
        /// Whether a dead daemon's requests are resent.
        #[arg(long, action = clap::ArgAction::Set)]
        resend: bool,
        /// The first daemon's pid.
        #[arg(long)]
        daemon: u32,
        /// The first daemon's catalog fingerprint (hex).
        #[arg(long)]
        catalog: String,
        /// The mountpoint, resolved.
        #[arg(long)]
        mountpoint: PathBuf,
        /// The log to append to (default: stderr).
        #[arg(long)]
        log: Option<PathBuf>,
        /// The daemon's command line, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Unmount a loosefs mount (also stale ones left by a killed daemon).
    ///
    /// Example: loosefs umount /mnt/train
    Umount {
        /// A loosefs mount's mountpoint.
        mountpoint: PathBuf,
        /// Detach a busy mount now; it goes away when the last user leaves.
        #[arg(long)]
        lazy: bool,
    },
    /// Mount a FUSE connection at MOUNTPOINT (root) and hand its descriptor to a daemon without
    /// privileges (`loosefs mount SOURCE /dev/fd/N --foreground`, as another user or in a
    /// container): to COMMAND as its fd N, or over a Unix socket (`--send`) to a `--receive`
    /// in another container. Waits for the daemon's side to end and unmounts then.
    ///
    /// Example: loosefs fuse-fd /mnt/train --owner nobody -- setpriv --reuid=nobody
    /// --regid=nogroup --clear-groups loosefs mount train.pack /dev/fd/3 --foreground
    FuseFd {
        /// Where to mount (not with `--receive`).
        #[arg(required_unless_present = "receive")]
        mountpoint: Option<PathBuf>,
        /// Let users other than the daemon's (root included) use the mount.
        #[arg(long)]
        allow_other: bool,
        /// The user the mount belongs to (a name or a uid; default: root): without
        /// --allow-other only that user can use it. Give the user the daemon runs as.
        #[arg(long, value_name = "USER", conflicts_with = "receive")]
        owner: Option<String>,
        /// The descriptor number COMMAND gets (also in its environment as LOOSEFS_FUSE_FD).
        #[arg(long, default_value_t = 3)]
        fd: i32,
        /// Kernel read-ahead of the mount, KiB (0 keeps the kernel's default, as `mount` does).
        #[arg(long, value_name = "KB", default_value_t = 0)]
        read_ahead_kb: u32,
        /// Send the descriptor over the Unix socket at this path instead of running COMMAND.
        #[arg(long, value_name = "SOCKET", conflicts_with_all = ["receive", "command"])]
        send: Option<PathBuf>,
        /// No mount: receive a descriptor at this Unix socket (from `--send`) and run COMMAND
        /// with it.
        #[arg(long, value_name = "SOCKET", conflicts_with_all = ["mountpoint", "allow_other"])]
        receive: Option<PathBuf>,
        /// The command to run with the descriptor, after `--`.
        #[arg(last = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Run the Kubernetes CSI node plugin (root, in the driver's privileged container): serves
    /// the CSI Identity and Node services at --endpoint, mounts each published volume at its
    /// pod's target path and hands it to `loosefs csi-mounter`, which serves it unprivileged.
    /// See docs/CLUSTERS.md.
    ///
    /// Example: loosefs csi --endpoint unix:///csi/csi.sock --node-id "$NODE_NAME"
    Csi {
        /// The Unix socket the kubelet (through node-driver-registrar) calls.
        #[arg(long, default_value = "unix:///csi/csi.sock")]
        endpoint: String,
        /// This node's id, normally its Kubernetes name (the downward API's spec.nodeName).
        #[arg(long, env = "NODE_NAME")]
        node_id: String,
        /// The driver's name: the CSIDriver object's and the PersistentVolumes' `driver`.
        #[arg(long, default_value = "csi.loosefs.dev")]
        driver_name: String,
        /// The Unix socket of `loosefs csi-mounter`.
        #[arg(
            long,
            value_name = "SOCKET",
            default_value = "/loosefs/run/mounter.sock"
        )]
        mounter: PathBuf,
        /// A directory shared with the mounter at the same path, on a disk the admin names
        /// (the manifests: under the kubelet's directory): each staged volume's log
        /// (`volumes/`) and block cache (`caches/`), owned by the mounter's user, and root's
        /// records (`state/`).
        #[arg(long, value_name = "DIR", default_value = "/loosefs/volumes")]
        work_dir: PathBuf,
        /// The kubelet's directory: target paths outside it are refused.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
        kubelet_dir: PathBuf,
        /// Seconds a publish waits for its daemon to serve before answering ABORTED (the
        /// kubelet retries; the daemon keeps starting).
        #[arg(long, value_name = "SECONDS", default_value_t = 100)]
        publish_timeout: u64,
        /// Seconds an unstaged volume's log and block cache are kept in --work-dir (a pod that
        /// comes back within it reads from the cache).
        #[arg(long, value_name = "SECONDS", default_value_t = 86400)]
        keep_after_unstage: u64,
        /// Percent of --work-dir's file system a volume's block cache leaves free unless its
        /// `cache-size` option says otherwise (20: above the kubelet's default eviction
        /// thresholds, nodefs.available<10% and imagefs.available<15%).
        #[arg(long, value_name = "PERCENT", default_value_t = 20, value_parser = clap::value_parser!(u8).range(0..=100))]
        cache_keep_free: u8,
        /// Serve every staged volume's metrics at this address (`GET /metrics`, Prometheus
        /// text, each sample labelled with its volume; `loosefs_csi_volume_up` per volume).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Run the CSI driver's mounter (as a user other than root, with no capability): takes each
    /// volume `loosefs csi` hands over at --socket and serves it with a `loosefs mount` daemon
    /// of its own user. See docs/CLUSTERS.md.
    ///
    /// Example: loosefs csi-mounter --socket /loosefs/mounter.sock
    CsiMounter {
        /// The Unix socket to listen at (shared with `loosefs csi`).
        #[arg(
            long,
            value_name = "SOCKET",
            default_value = "/loosefs/run/mounter.sock"
        )]
        socket: PathBuf,
        /// Do not serve: exit 0 when a mounter answers at --socket, 1 when none does (the
        /// mounter container's liveness probe).
        #[arg(long)]
        check: bool,
    },
    /// Summarise a pack: samples, directories, bytes, alignment, index version, JPEG counts;
    /// or a dataset in another format: format, samples, classes, fields, compression,
    /// zero-copy or not, its files and where its index is kept.
    ///
    /// Example: loosefs info train.pack --json; loosefs info shards/ (WebDataset)
    Info {
        /// The dataset: a pack, a directory, a dataset in another format, or a URL of one
        /// (s3://, gs://, az://, https://; or of a prefix or directory of loose files).
        pack: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        source: loosefs::options::SourceArgs,
    },
    /// Print a shell completion script, generated from these definitions.
    ///
    /// Example: loosefs completions bash > /etc/bash_completion.d/loosefs
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from these definitions.
    ///
    /// Example: loosefs man > /usr/local/share/man/man1/loosefs.1
    Man,
    /// Check every sample's CRC-32 (and every byte against the source tree when given);
    /// exits 1 naming each mismatch.
    ///
    /// Example: loosefs verify train.pack --against ~/data/imagenet/train
    Verify {
        /// The pack to check (a path or a URL: s3://, gs://, az://, https://).
        pack: PathBuf,
        #[arg(long)]
        against: Option<PathBuf>,
        #[command(flatten)]
        remote: loosefs::options::RemoteArgs,
    },
}

/// Output of `loosefs stats`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StatsFormat {
    /// A table for people.
    Text,
    /// The JSON report.
    Json,
    /// Prometheus text format 0.0.4 (node_exporter's textfile collector reads it): counters
    /// `_total`, gauges, one histogram.
    Prometheus,
    /// OpenMetrics text (what Prometheus scrapes over HTTP): the same families.
    Openmetrics,
}

/// The arguments of `loosefs pack`.
#[derive(clap::Args)]
struct PackCmd {
    /// Source directory (an ImageFolder tree, or any tree of files), a zip archive, or a
    /// WebDataset/tar, TFRecord, MDS, LitData, GulpIO or FFCV dataset.
    src: PathBuf,
    /// Output pack; written to a temp file beside it and renamed when complete.
    out: PathBuf,
    /// Reader threads (default: number of CPUs).
    #[arg(long, short = 'j', default_value_t = 0)]
    jobs: usize,
    /// Alignment of each sample's data in bytes: a power of two from 1 to 32768. 512 reads
    /// and stores the least padding; 4096 (a page) lets the mount drop every pack page of a
    /// served sample from the page cache, where 512 keeps one page shared by neighbours.
    #[arg(long, default_value_t = loosefs::pack::DEFAULT_ALIGN)]
    align: u32,
    /// Follow symbolic links (default: report and skip them).
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    follow_links: bool,
    /// Replace OUT if it exists.
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    force: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Progress for programs that wrap `loosefs pack` (the Python package's tqdm bar): one
    /// JSON object per line on stderr, at most five a second per step and one at its end,
    /// `{"progress": {"step": "pack", "unit": "bytes", "done": N, "total": N, "files": N}}`
    /// (sample bytes written, of all; a directory's walk comes first as step `walk`).
    #[arg(long)]
    progress_lines: bool,
    #[command(flatten)]
    source: loosefs::options::SourceArgs,
}

fn open(pack: &std::path::Path) -> Result<Pack> {
    Pack::open(pack).with_context(|| format!("cannot open pack {}", pack.display()))
}

/// `loosefs pack`: packs `src` (to a URL: into a staging file in the cache, then uploaded).
fn cmd_pack(args: PackCmd) -> Result<()> {
    let PackCmd {
        src,
        out,
        jobs,
        align,
        follow_links,
        force,
        json,
        progress_lines,
        source,
    } = args;
    let url = out
        .to_str()
        .filter(|s| loosefs::storage::object::is_url(s))
        .map(str::to_string);
    // A URL: packed into a temp file in the cache directory, then uploaded.
    let staging = match &url {
        Some(_) => {
            let root = source
                .remote
                .cache_dir
                .clone()
                .unwrap_or_else(loosefs::storage::block_cache::default_root);
            std::fs::create_dir_all(&root)?;
            Some(
                tempfile::Builder::new()
                    .suffix(".pack")
                    .tempfile_in(&root)?,
            )
        }
        None => None,
    };
    let out = staging.as_ref().map_or(out, |t| t.path().to_path_buf());
    let remote = source.remote.clone();
    let opts = loosefs::packer::PackOptions {
        jobs,
        align,
        follow_links,
        force: force || url.is_some(),
        progress: Progress::from_flags(progress_lines, json),
        source: source.open_options(),
    };
    let r = loosefs::packer::pack_dir(&src, &out, &opts)?;
    if let Some(url) = &url {
        loosefs::storage::object::connect(remote.config()).upload(url, &out)?;
        if !json {
            loosefs::eprintln_lossy!("uploaded {} bytes to {url}", r.pack_bytes);
        }
    }
    let out = url.map_or(out, std::path::PathBuf::from);
    if json {
        outln!("{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        for (p, why) in &r.skipped {
            loosefs::eprintln_lossy!("skipped {}: {why}", p.display());
        }
        outln!(
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
        )?;
    }
    if align > 1 && r.bytes > 0 && r.pack_bytes > 2 * r.bytes {
        // Many files far smaller than the alignment: padding, headers and the index dominate.
        loosefs::eprintln_lossy!(
            "loosefs: warning: the pack is {:.1}x its files' bytes ({} files of {:.0} bytes on \
             average, each aligned to {align} bytes, with its zip headers and index entry); \
             `--align 1` leaves out the padding",
            r.pack_bytes as f64 / r.bytes as f64,
            r.files,
            r.bytes as f64 / r.files.max(1) as f64,
        );
    }
    Ok(())
}

/// `loosefs index`: the dataset indexed (or its local index reused) and written as a shared
/// index.
fn cmd_index(
    src: &std::path::Path,
    out: Option<&std::path::Path>,
    args: &loosefs::options::SourceArgs,
    progress: Progress,
) -> Result<()> {
    use loosefs::formats::index::shared;
    if let Some(url) = src.to_str().filter(|s| loosefs::storage::object::is_url(s)) {
        outln!(
            "{}",
            loosefs::open::index_url(
                url,
                out,
                &args.open_options(),
                loosefs::storage::object::connect(args.remote.config()),
                progress,
            )?
        )?;
        return Ok(());
    }
    let opts = loosefs::formats::ScanOptions {
        shared_index: loosefs::formats::SharedIndex::Off,
        ..args.open_options().scan_options()?
    };
    let f = loosefs::formats::index::open(src, &opts, args.index_dir.as_deref(), progress)?;
    let src = &f.header.source;
    let dest = out.map_or_else(|| shared::default_path(src), std::path::Path::to_path_buf);
    shared::write(&f, src, &dest)?;
    let i = f.info();
    outln!(
        "{}: shared index of {} ({}, {} samples in {} files, verify {}); mounts of it use it while every file keeps its size and mtime",
        dest.display(),
        src.display(),
        i.format,
        i.samples,
        i.files,
        i.verify
    )?;
    Ok(())
}

/// `loosefs info`: a pack's, a remote pack's or a foreign dataset's summary.
fn cmd_info(
    pack: &std::path::Path,
    json: bool,
    source: &loosefs::options::SourceArgs,
) -> Result<()> {
    let source = source.open_options().for_info(pack);
    let progress = Progress::from_flags(false, json);
    let d = loosefs::open::Dataset::open(pack, &source, progress)?.info()?;
    match json {
        true => outln!("{}", d.json)?,
        false => print!("{}", d.text),
    }
    Ok(())
}

/// `loosefs verify`: every sample's CRC-32, and every byte against `against`; exit code 1
/// when something does not match.
fn cmd_verify(
    pack: &std::path::Path,
    against: Option<&std::path::Path>,
    remote: &loosefs::options::RemoteArgs,
) -> Result<i32> {
    // A URL: every block is downloaded into the cache, which is then the whole pack.
    let p = match pack
        .to_str()
        .filter(|s| loosefs::storage::object::is_url(s))
    {
        Some(url) => {
            let store = loosefs::storage::object::connect(remote.config());
            let mut r =
                loosefs::open::remote_pack::RemotePack::open(url, &*store, &remote.config())
                    .with_context(|| format!("cannot open {url}"))?;
            r.finish();
            open(&r.download()?)?
        }
        // `verify` takes a pack: a directory is the wrong thing to give it, not a damaged pack.
        None => open(pack).map_err(|e| match pack.is_dir() {
            true => loosefs::exit_code::with_kind(e, loosefs::exit_code::ExitKind::Usage),
            false => e,
        })?,
    };
    let problems = loosefs::verify::verify(&p, against)?;
    for line in &problems {
        outln!("MISMATCH {line}")?;
    }
    if !problems.is_empty() {
        loosefs::eprintln_lossy!("{}: {} problem(s)", pack.display(), problems.len());
        return Ok(1);
    }
    outln!(
        "{}: {} samples OK{}",
        pack.display(),
        p.totals().files,
        if against.is_some() {
            ", identical to the source"
        } else {
            ""
        }
    )?;
    Ok(0)
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Pack(args) => cmd_pack(args)?,
        Cmd::Mount {
            pack,
            mountpoint,
            opts,
        } => loosefs::mount::mount(&pack, &mountpoint, &opts.daemon_options()?)?,
        Cmd::Stats {
            mountpoint,
            format,
            json,
            prometheus,
        } => {
            let v: loosefs::report::Report = loosefs::client::read_control(&mountpoint, "stats")?;
            let format = match (json, prometheus) {
                (true, _) => StatsFormat::Json,
                (_, true) => StatsFormat::Prometheus,
                _ => format,
            };
            if matches!(format, StatsFormat::Prometheus | StatsFormat::Openmetrics) {
                let mnt = std::fs::canonicalize(&mountpoint).unwrap_or(mountpoint.clone());
                let mnt = mnt.to_string_lossy();
                if format == StatsFormat::Prometheus {
                    print!("{}", loosefs::metrics::prometheus(&v, &mnt));
                } else {
                    print!("{}", loosefs::metrics::openmetrics(&v, &mnt));
                }
            } else if format == StatsFormat::Json {
                outln!("{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                print!("{}", loosefs::client::format_stats(&v));
            }
        }
        Cmd::Warm { mountpoint, wait } => {
            let v: loosefs::report::WarmCommandReport =
                loosefs::client::read_control(&mountpoint, "warm")?;
            if !wait {
                outln!("{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                loosefs::client::wait_warm(&mountpoint)?;
            }
        }
        Cmd::DropCache { mountpoint, json } => {
            let v: loosefs::report::DropCacheReport =
                loosefs::client::read_control(&mountpoint, "drop-cache")?;
            match json {
                true => outln!("{}", serde_json::to_string_pretty(&v)?)?,
                false => print!("{}", loosefs::client::format_drop_cache(&v)),
            }
        }
        Cmd::Umount { mountpoint, lazy } => loosefs::mount::unmount_and_wait(&mountpoint, lazy)?,
        Cmd::Restart { mountpoint } => {
            let r = loosefs::mount::keeper::restart(&mountpoint)?;
            let restarts = r.daemon.keeper.map_or(0, |k| k.restarts);
            outln!(
                "restarted {}: daemon pid {}, loosefs {} ({restarts} restarts so far)",
                mountpoint.display(),
                r.daemon.pid,
                r.daemon.version
            )?;
        }
        Cmd::Keep {
            offer,
            resend,
            daemon,
            catalog,
            mountpoint,
            log,
            command,
        } => {
            let offer = loosefs::fuse::takeover::InitOffer::parse(&offer)?;
            let catalog = u32::from_str_radix(&catalog, 16)
                .map_err(|_| anyhow::anyhow!("--catalog {catalog:?} is not a fingerprint"))?;
            return loosefs::mount::keeper::keep(loosefs::mount::keeper::KeepArgs {
                fd: loosefs::mount::keeper::KEPT_FD,
                offer,
                resend,
                daemon: Some(daemon),
                catalog,
                mountpoint,
                log,
                command,
            });
        }
        Cmd::Info { pack, json, source } => cmd_info(&pack, json, &source)?,
        Cmd::FuseFd {
            mountpoint,
            allow_other,
            owner,
            fd,
            read_ahead_kb,
            send,
            receive,
            command,
        } => {
            use loosefs::mount::handover;
            if let Some(socket) = receive {
                return handover::receive(&socket, fd, &command);
            }
            let to = match send {
                Some(socket) => handover::Handover::Send(socket),
                None => handover::Handover::Run { fd, command },
            };
            let mnt = mountpoint.expect("clap requires it without --receive");
            return handover::fuse_fd(&mnt, allow_other, owner.as_deref(), read_ahead_kb, &to);
        }
        Cmd::Csi {
            endpoint,
            node_id,
            driver_name,
            mounter,
            work_dir,
            kubelet_dir,
            publish_timeout,
            keep_after_unstage,
            cache_keep_free,
            metrics_addr,
        } => {
            let socket = loosefs::csi::endpoint_path(&endpoint)?;
            loosefs::csi::serve(
                &socket,
                loosefs::csi::NodeConfig {
                    driver_name,
                    node_id,
                    mounter,
                    work_dir,
                    kubelet_dir,
                    publish_timeout: std::time::Duration::from_secs(publish_timeout),
                    keep_after_unstage: std::time::Duration::from_secs(keep_after_unstage),
                    cache_keep_free,
                    metrics_addr,
                },
            )?
        }
        Cmd::CsiMounter { socket, check } => {
            if check {
                return match loosefs::csi::mounter::ping(&socket) {
                    Ok(()) => Ok(0),
                    Err(e) => {
                        loosefs::eprintln_lossy!("loosefs csi-mounter --check: {e:#}");
                        Ok(1)
                    }
                };
            }
            loosefs::csi::mounter::run(&socket)?
        }
        Cmd::Index {
            source,
            out,
            progress_lines,
            args,
        } => cmd_index(
            &source,
            out.as_deref(),
            &args,
            Progress::from_flags(progress_lines, false),
        )?,
        Cmd::Verify {
            pack,
            against,
            remote,
        } => return cmd_verify(&pack, against.as_deref(), &remote),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "loosefs", &mut std::io::stdout());
        }
        Cmd::Man => {
            use clap::CommandFactory;
            man_page(&Cli::command(), &mut std::io::stdout())?;
        }
    }
    Ok(0)
}

/// Reports a panic in one line: where and what. Whoever catches it (a scan, a chunk decode, a
/// FUSE request) names the file and answers with an error; a backtrace is printed only when
/// `LOOSEFS_BACKTRACE=1` (a bug report), not for every damaged input.
fn panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = loosefs::stats::panic_message(info.payload());
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        loosefs::eprintln_lossy!("loosefs: internal error at {at}: {msg}");
        if std::env::var_os("LOOSEFS_BACKTRACE").is_some_and(|v| v == "1") {
            loosefs::eprintln_lossy!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
}

/// Writes the manual page of `cmd` and a section per subcommand (roff, `man 1 loosefs`).
fn man_page(cmd: &clap::Command, out: &mut dyn std::io::Write) -> Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name();
        writeln!(out, ".SH \"LOOSEFS {}\"", name.to_uppercase())?;
        let sub_man = clap_mangen::Man::new(sub.clone().bin_name(format!("loosefs {name}")));
        sub_man.render_synopsis_section(out)?;
        sub_man.render_description_section(out)?;
        sub_man.render_options_section(out)?;
    }
    man.render_version_section(out)?;
    Ok(())
}

/// Warnings and errors by default; RUST_LOG overrides; `mount --debug` adds loosefs's own
/// debug messages. fuser warns when the mount it tracks was already unmounted by us or by
/// `umount`: noise, left out.
fn init_logging(debug: bool) {
    let mut b = env_logger::Builder::new();
    b.filter_level(log::LevelFilter::Warn)
        .filter_module("fuser::mnt", log::LevelFilter::Error)
        .parse_env("RUST_LOG");
    if debug {
        b.filter_module("loosefs", log::LevelFilter::Debug);
    }
    // The daemon's log file, once it has one, rotated by size while it runs.
    b.target(env_logger::Target::Pipe(Box::new(loosefs::mount::LogSink)));
    b.init();
}

/// An error and its causes in one line, each subject said once: a cause that repeats what the
/// message before it is about (`cannot mount URL` then `cannot open URL`, or `URL: …` after a
/// message ending in URL) keeps only what it adds.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut subject: Option<String> = None;
    for cause in e.chain() {
        let mut text = cause.to_string();
        if let Some(s) = &subject {
            // `cannot VERB SUBJECT` (and `: rest`) about the same subject: only the rest.
            if let Some(rest) = text.strip_prefix("cannot ").and_then(|t| {
                let (_, after_verb) = t.split_once(' ')?;
                let object = after_verb.strip_prefix("source ").unwrap_or(after_verb);
                object
                    .strip_prefix(s.as_str())
                    .filter(|r| r.is_empty() || r.starts_with(':'))
            }) {
                text = rest.trim_start_matches(':').trim_start().to_string();
            } else if let Some(rest) = text.strip_prefix(&format!("{s}: ")) {
                text = rest.to_string();
            }
        }
        if text.is_empty() {
            continue;
        }
        subject = text
            .strip_prefix("cannot ")
            .and_then(|t| t.split_once(' '))
            .map(|(_, s)| s.split(": ").next().unwrap_or(s).to_string())
            .or(subject);
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Parses the command line, exiting as clap does on an error; a value refused that came from a
/// `LOOSEFS_*` variable rather than the command line is reported naming that variable, in one
/// line.
fn parse_cli(args: Vec<std::ffi::OsString>) -> Cli {
    use clap::CommandFactory;
    match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(msg) = loosefs::options::parse::env_error(&e, &Cli::command(), &args) {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "loosefs: error: {msg}");
                std::process::exit(2);
            }
            e.exit()
        }
    }
}

fn main() {
    panic_hook();
    // Called by mount(8) as a helper (`mount -t fuse.loosefs`, an fstab line): the options
    // come as `-o a,b=c` and become `loosefs mount` flags.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv0 = args
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name());
    let cli = if argv0.is_some_and(|n| {
        loosefs::options::fstab::HELPER_NAMES
            .iter()
            .any(|h| n == *h)
    }) {
        match loosefs::options::fstab::helper_args(&args) {
            Ok(a) => {
                loosefs::mount::set_command_line(a.clone());
                parse_cli(a)
            }
            Err(e) => {
                loosefs::eprintln_lossy!("loosefs: error: {e:#}");
                std::process::exit(2);
            }
        }
    } else if let Some(a) = loosefs::options::fstab::expand_mount_o(&args) {
        // `loosefs mount SRC MNT -o ro,warm`: mount(8)'s way of giving options.
        loosefs::mount::set_command_line(a.clone());
        parse_cli(a)
    } else {
        parse_cli(args)
    };
    init_logging(matches!(&cli.cmd, Cmd::Mount { opts, .. } if opts.debug));
    match run(cli) {
        Ok(code) => std::process::exit(code),
        // The daemon said why already, on the same stderr.
        Err(e) if e.downcast_ref::<loosefs::mount::DaemonFailed>().is_some() => {
            let code = e
                .downcast_ref::<loosefs::mount::DaemonFailed>()
                .map_or(2, |d| d.0);
            std::process::exit(code)
        }
        Err(e) => {
            loosefs::eprintln_lossy!("loosefs: error: {}", one_line(&e));
            std::process::exit(loosefs::exit_code::ExitKind::of(&e).code());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_says_each_subject_once() {
        let url = "https://127.0.0.1:9/data.pack";
        let e = anyhow::anyhow!("nothing listens at 127.0.0.1:9 (connection refused)")
            .context(format!("{url}: cannot reach the server"))
            .context(format!("cannot open {url}"))
            .context(format!("cannot mount {url}"));
        assert_eq!(
            one_line(&e),
            format!(
                "cannot mount {url}: cannot reach the server: nothing listens at 127.0.0.1:9 (connection refused)"
            )
        );
        // `cannot open source X` after `cannot index X`, and a cause that only repeats the
        // subject, add only what is new.
        let e = anyhow::anyhow!("/d/x.tar: truncated member")
            .context("cannot open source /d/x.tar")
            .context("cannot index /d/x.tar");
        assert_eq!(one_line(&e), "cannot index /d/x.tar: truncated member");
        // Different subjects are kept, in order, on one line.
        let e = anyhow::anyhow!("Permission denied (os error 13)")
            .context("cannot open log /var/log/x");
        let line = one_line(&e);
        assert_eq!(
            line,
            "cannot open log /var/log/x: Permission denied (os error 13)"
        );
        assert!(!line.contains('\n'));
    }
}
