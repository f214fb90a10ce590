//! The command line's grammar: every command, its arguments and their help (clap's derive;
//! the doc comments are the help text `--help` and the man page print). `main` parses it and
//! runs each command; the options shared by commands are [`super::MountArgs`],
//! [`super::SourceArgs`] and [`super::RemoteArgs`].
// The doc comments of clap's arguments are their help; a flattened group's is its own.
#![allow(missing_docs)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "loosefs",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LOOSEFS_COMMIT"), ")"),
    about = "Mount a packed ML dataset so unmodified loaders see ordinary files"
)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
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
        opts: Box<crate::options::MountArgs>,
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
        args: crate::options::SourceArgs,
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
        source: crate::options::SourceArgs,
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
        remote: crate::options::RemoteArgs,
    },
}

/// Output of `loosefs stats`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsFormat {
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
pub struct PackCmd {
    /// Source directory (an ImageFolder tree, or any tree of files), a zip archive, or a
    /// WebDataset/tar, TFRecord, MDS, LitData, GulpIO or FFCV dataset.
    pub src: PathBuf,
    /// Output pack; written to a temp file beside it and renamed when complete.
    pub out: PathBuf,
    /// Reader threads (default: number of CPUs).
    #[arg(long, short = 'j', default_value_t = 0)]
    pub jobs: usize,
    /// Alignment of each sample's data in bytes: a power of two from 1 to 32768. 512 reads
    /// and stores the least padding; 4096 (a page) lets the mount drop every pack page of a
    /// served sample from the page cache, where 512 keeps one page shared by neighbours.
    #[arg(long, default_value_t = crate::pack::DEFAULT_ALIGN)]
    pub align: u32,
    /// Follow symbolic links (default: report and skip them).
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub follow_links: bool,
    /// Replace OUT if it exists.
    #[arg(long, value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub force: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Progress for programs that wrap `loosefs pack` (the Python package's tqdm bar): one
    /// JSON object per line on stderr, at most five a second per step and one at its end,
    /// `{"progress": {"step": "pack", "unit": "bytes", "done": N, "total": N, "files": N}}`
    /// (sample bytes written, of all; a directory's walk comes first as step `walk`).
    #[arg(long)]
    pub progress_lines: bool,
    #[command(flatten)]
    pub source: crate::options::SourceArgs,
}
