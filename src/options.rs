//! Options of `loosefs mount`: one clap [`Args`] type, parsed once by the command line and
//! converted once into what the server needs ([`MountArgs::server_options`]).

pub use crate::fs::FsOptions;

pub mod cli;
mod decode;
pub mod fstab;
pub mod parse;
use crate::memory::{parse_bytes, parse_size};

/// `HOST:PORT` (a name, an IPv4 address, or `[IPv6]`) as the first address the name resolves
/// to. Errors: no port, or a name that does not resolve, said with what to give.
pub fn parse_socket_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let (host, port) = s
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        .ok_or_else(|| format!("{s}: give HOST:PORT, e.g. localhost:9464 or 127.0.0.1:9464"))?;
    (
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse::<u16>().unwrap_or(0),
    )
        .to_socket_addrs()
        .map_err(|e| format!("{s}: cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s}: {host} resolves to no address"))
}
use crate::mount::DaemonOptions;
use crate::readahead::ReadAheadOptions;
use crate::storage::object::remote_config::{self, RemoteConfig};
use anyhow::Result;
use clap::{Args, ValueEnum};
pub use decode::{DecodeArgs, ViewArg};
use std::path::PathBuf;

/// `--passthrough`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Passthrough {
    /// Where the kernel and privileges allow it (else the daemon reads).
    On,
    /// Never: the daemon reads.
    Off,
}

/// `--transport`: how the kernel's requests reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it (as root, `enable_uring` of the `fuse`
    /// module is turned on), else `/dev/fuse`. Passthrough mounts use `/dev/fuse`.
    Auto,
    /// FUSE over io_uring; the mount fails where the kernel cannot give it.
    Uring,
    /// `/dev/fuse` reads and writes, one pair per request.
    Classic,
}

/// Options of `loosefs mount` (everything but the pack and the mountpoint).
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// How a source that is not a loosefs pack is read.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Decoded views and their decoder.
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Serve in the foreground instead of starting a daemon.
    #[arg(long, short = 'f', help_heading = "Daemon and logs", env = "LOOSEFS_FOREGROUND", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub foreground: bool,
    /// Keep the mount across daemon deaths: a small keeper process holds the FUSE connection
    /// and starts a new daemon when one dies (a crash, the OOM killer) or on `loosefs restart`;
    /// readers see a pause, not an error. Default: on for a mount in the background, off with
    /// --foreground (a service manager restarts that one). A daemon dying 5 times within 60 s
    /// ends the mount.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_KEEPER", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", hide_possible_values = true)]
    pub keeper: Option<bool>,
    /// Have the kernel resend the requests a dead daemon had read but not answered
    /// (FUSE_NOTIFY_RESEND, Linux 6.9+), so a kept mount loses no read. Off, or on an older
    /// kernel, those requests (only those) fail with an error.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_RESEND", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", hide_default_value = true, hide_possible_values = true)]
    pub resend: bool,
    /// FUSE worker threads. A thread waiting for the disk serves nothing else, so this caps
    /// the reads in flight on a cold pack.
    #[arg(
        long,
        default_value_t = 16,
        help_heading = "Daemon and logs",
        env = "LOOSEFS_THREADS"
    )]
    pub threads: usize,
    /// Kernel read-ahead for this mount, KiB (0 keeps the kernel's default, 128). Larger
    /// helps readers in storage order and hurts shuffled ones (docs/TUNING.md).
    #[arg(
        long,
        default_value_t = 0,
        help_heading = "Read-ahead",
        env = "LOOSEFS_READ_AHEAD_KB"
    )]
    pub read_ahead_kb: u32,
    /// Log file of the background daemon (default: `~/.local/state/loosefs/log/<mountpoint>.log`,
    /// or under `$XDG_STATE_HOME`; `loosefs stats` names it). A log past 8 MiB is rotated while
    /// the daemon runs (to `<log>.1`, the one before to `<log>.2`; older ones removed);
    /// `/dev/null` discards it; `-` keeps it on the stderr
    /// `loosefs mount` was given (whoever reads that pipe waits until the daemon exits). Level
    /// from RUST_LOG.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_LOG")]
    pub log: Option<PathBuf>,
    /// Take store settings and credentials from FILE (`NAME=VALUE` lines; only the stores'
    /// variables, `AWS_*`, `GOOGLE_*`, `GCE_METADATA_*`, `AZURE_*`, `STORAGE_EMULATOR_HOST`, and
    /// `LOOSEFS_*`), as a site gives them to a job's daemon without a command line or a log
    /// holding them: the Slurm prolog hands its root-owned file as `/dev/fd/4`.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Daemon and logs",
        env = "LOOSEFS_ENV_FILE"
    )]
    pub env_file: Option<PathBuf>,
    /// Log loosefs's debug messages too (each failed request with its path and error, each
    /// remote GET with its range and time): the same as `RUST_LOG=loosefs=debug`, into the
    /// log file.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_DEBUG", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub debug: bool,
    /// Progress for programs that wrap `loosefs mount` (the Python package's tqdm bars): the
    /// first mount's indexing and walk, and `--wait`'s pin and warm, as JSON lines on stderr
    /// instead of the terminal's bars, `{"progress": {"step": "index", "unit": "samples",
    /// "done": N, "total": N}}` at most five a second per step, and `{"note": "..."}` for
    /// what a terminal shows as `loosefs: ...`.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_PROGRESS_LINES", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub progress_lines: bool,
    /// Largest read-ahead window in pack order, MiB (0 disables read-ahead across samples).
    #[arg(
        long,
        default_value_t = 64,
        help_heading = "Read-ahead",
        env = "LOOSEFS_PREFETCH_MAX_MB"
    )]
    pub prefetch_max_mb: u64,
    /// Largest read-ahead window along an announced epoch order (`<mnt>/.loosefs/order`):
    /// bytes read ahead and not yet served, MiB (0: orders are counted, not read ahead).
    #[arg(
        long,
        default_value_t = 256,
        help_heading = "Read-ahead",
        env = "LOOSEFS_ORDER_WINDOW_MB"
    )]
    pub order_window_mb: u64,
    /// Keep this much of the pack resident (mlock), from its start: a size such as 2G or
    /// 512M, or `all`. Refused when it does not fit in available memory or the cgroup limit.
    #[arg(long, value_parser = parse_pin, help_heading = "Caches and memory", env = "LOOSEFS_PIN")]
    pub pin: Option<u64>,
    /// Stream the whole pack into the page cache in the background after mounting.
    #[arg(long, help_heading = "Caches and memory", env = "LOOSEFS_WARM", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub warm: bool,
    /// Return only once `--pin` and `--warm` are complete, showing their progress (without it
    /// they proceed in the background and `loosefs stats` shows how far they are).
    #[arg(long, help_heading = "Caches and memory", env = "LOOSEFS_WAIT", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub wait: bool,
    /// Keep a sample's pack pages cached after serving it. By default they are dropped: the
    /// mount's own page cache holds the same bytes, and keeping both caches them twice.
    #[arg(long, help_heading = "Caches and memory", env = "LOOSEFS_KEEP_PACK_CACHE", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub keep_pack_cache: bool,
    /// While a reader walks the pack in order, push this many following samples into the
    /// kernel's page cache ahead of it (FUSE_NOTIFY_STORE), so their reads need no round
    /// trip to the daemon; a reader following an announced order is pushed the samples the
    /// order read ahead (up to 256 MiB past its last READ) whatever this number. 0 disables
    /// both.
    #[arg(
        long,
        default_value_t = 64,
        help_heading = "Read-ahead",
        env = "LOOSEFS_PUSH_AHEAD"
    )]
    pub push_ahead: usize,
    /// Let every local user read the mount (FUSE `allow_other`; a non-root user needs
    /// `user_allow_other` in /etc/fuse.conf). By default only the user who mounted it can,
    /// whatever the files' permission bits say. Control commands (`warm`, `drop-cache`) stay
    /// the owner's and root's.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_ALLOW_OTHER", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub allow_other: bool,
    /// Mount over a directory that holds files (they are hidden while mounted). By default a
    /// non-empty mountpoint is refused, as rclone and s3fs refuse it.
    #[arg(long, help_heading = "Daemon and logs", env = "LOOSEFS_ALLOW_NON_EMPTY", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub allow_non_empty: bool,
    /// How a loose directory's files reach readers: `off` (default) the daemon reads them and
    /// the kernel keeps them in the mount's page cache (warm reads need no round trip at all);
    /// `on` the kernel reads the original files itself (FUSE passthrough: no READ, no second
    /// copy in memory, but an OPEN and a RELEASE round trip per open file, so many small
    /// files read slower than with `off`) where the kernel and privileges allow it, else the
    /// daemon. Packs: the daemon.
    #[arg(long, value_enum, default_value_t = Passthrough::Off, help_heading = "Daemon and logs", env = "LOOSEFS_PASSTHROUGH")]
    pub passthrough: Passthrough,
    /// How requests reach the daemon: `uring` (FUSE over io_uring, Linux 6.14+: a reply and
    /// the wait for the next request in one system call, per-CPU queues), `classic`
    /// (`/dev/fuse`), `auto` (uring where the kernel offers it; passthrough needs classic).
    /// `stats` shows which one serves. Default from `LOOSEFS_TRANSPORT`.
    #[arg(long, value_enum, default_value_t = Transport::Auto, env = "LOOSEFS_TRANSPORT", help_heading = "Daemon and logs")]
    pub transport: Transport,
    /// Serve the mount's statistics over HTTP at ADDR (HOST:PORT, e.g. `localhost:9464` or
    /// `127.0.0.1:9464`; port 0 picks a free one, said when the mount is ready) for a
    /// Prometheus server to scrape: `GET /metrics` answers what `stats --format prometheus`
    /// prints (OpenMetrics when the scrape asks for it). The address is bound before the mount
    /// is made: one in use fails the mount. Off by default.
    #[arg(long, value_name = "ADDR", value_parser = parse_socket_addr, help_heading = "Daemon and logs", env = "LOOSEFS_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// Options for sources in other packed formats (`mount`, `info`, `pack`).
#[derive(Args, Debug, Clone, Default)]
pub struct SourceArgs {
    /// Read the source as this format instead of detecting it: tar (webdataset), zip,
    /// tfrecord, mds, litdata, gulpio, ffcv, parquet (hf-parquet).
    #[arg(long, value_parser = parse_format, help_heading = "Source", env = "LOOSEFS_FORMAT")]
    pub format: Option<crate::formats::Format>,
    /// Class directory names, one per line: line i names the i-th smallest label (overrides
    /// the format's own names).
    #[arg(long, help_heading = "Source", env = "LOOSEFS_CLASS_NAMES")]
    pub class_names: Option<PathBuf>,
    /// The field holding the label, instead of the format's usual one: a WebDataset member
    /// extension (default cls), a TFRecord int64 feature (default image/class/label), an MDS
    /// integer column or a Parquet column (default: its ClassLabel).
    #[arg(long, help_heading = "Source", env = "LOOSEFS_LABEL")]
    pub label: Option<String>,
    /// Which fields of each sample are files: `image` (default: one file per sample, what
    /// ImageFolder expects) or `all` (every other field stored in place too, as
    /// `<stem>.<field>` beside the image, e.g. `<key>.cls`, `<key>.txt` for WebDataset).
    #[arg(long, default_value = "image", value_parser = ["image", "all"], help_heading = "Source", env = "LOOSEFS_FIELDS")]
    pub fields: String,
    /// How a foreign dataset is checked: `lazy` (default) indexes it reading each sample's
    /// head only (the JPEG header) and checks each sample against its
    /// format's checksum, or else against the CRC-32 of its first read, on every read; `full`
    /// reads every sample once at indexing (a CRC-32 each) before the mount serves any.
    #[arg(long, default_value = "lazy", value_parser = ["lazy", "full"], help_heading = "Source", env = "LOOSEFS_VERIFY")]
    pub verify: String,
    /// A shared index of the dataset written by `loosefs index` (default: `<SRC>.loosefs-index`
    /// beside the dataset, used when it exists and fits this mount's options; for a bucket prefix
    /// of loose objects, its listing): a stale one is refused, naming the file that changed.
    #[arg(long = "index", help_heading = "Source", env = "LOOSEFS_INDEX")]
    pub shared_index: Option<PathBuf>,
    /// A stale shared listing of loose objects (objects added, removed or replaced since
    /// `loosefs index`) is replaced: the prefix listed again and the listing rewritten in its
    /// place (over HTTPS: the server's listing served instead). Default: refused, naming one
    /// object that changed.
    #[arg(long = "refresh", help_heading = "Source", env = "LOOSEFS_REFRESH", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub refresh_index: bool,
    /// Where the index of a foreign source is kept (default: `index/` under
    /// $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs).
    #[arg(long, help_heading = "Source", env = "LOOSEFS_INDEX_DIR")]
    pub index_dir: Option<PathBuf>,
    /// Memory for decompressed chunks of a compressed source (zstd MDS shards and LitData
    /// chunks, deflated zip members), e.g. 2G; the least recently used chunk goes first.
    #[arg(long, value_parser = parse_bytes, default_value = "1G", help_heading = "Caches and memory", env = "LOOSEFS_CHUNK_CACHE")]
    pub chunk_cache: u64,
    /// How a dataset at a URL (s3://, gs://, az://, https://) is reached and cached.
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Read every JPEG header of a loose directory when it is opened (set from `--decode` by
    /// `mount`, and by `info`): decoded views need the dimensions.
    #[arg(skip)]
    pub probe_jpegs: bool,
}

/// Options for datasets at URLs (`mount`, `info`, `verify`, `pack`): S3, GCS, Azure Blob,
/// HTTP(S) (the stores of `crate::storage::object`).
#[derive(Args, Debug, Clone, Default)]
pub struct RemoteArgs {
    /// Endpoint of the store instead of the cloud's own: an S3-compatible server, e.g.
    /// http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's
    /// endpoint_url, else AWS), a GCS emulator (default: $STORAGE_EMULATOR_HOST), an Azure blob
    /// endpoint with its account, e.g. http://127.0.0.1:10000/devstoreaccount1 (default: the
    /// connection string's BlobEndpoint).
    #[arg(
        long,
        help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)",
        env = "LOOSEFS_ENDPOINT_URL"
    )]
    pub endpoint_url: Option<String>,
    /// S3 region to sign for first (default: $AWS_REGION, the profile's region, else
    /// us-east-1); a bucket elsewhere is followed to its own region, as the server names it.
    #[arg(
        long,
        help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)",
        env = "LOOSEFS_REGION"
    )]
    pub region: Option<String>,
    /// S3 Requester Pays: the requests say the requester pays for them
    /// (`x-amz-request-payer: requester`, as `aws s3 --request-payer requester`); a Requester
    /// Pays bucket refuses requests without it (403).
    #[arg(long, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_REQUEST_PAYER", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub request_payer: bool,
    /// GCS Requester Pays: the Google Cloud project billed for the requests
    /// (`x-goog-user-project`, as `gcloud storage --billing-project` and gsutil's `-u`).
    #[arg(
        long,
        value_name = "PROJECT",
        help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)",
        env = "LOOSEFS_BILLING_PROJECT"
    )]
    pub billing_project: Option<String>,
    /// Send unsigned requests (public buckets and containers); no credentials are looked up.
    /// Otherwise credentials are found as each cloud's own tools find them: S3 by the AWS
    /// chain (environment, profile, SSO, web identity, container, instance), GCS by Google's
    /// (GOOGLE_APPLICATION_CREDENTIALS incl. workload identity federation, gcloud's ADC file,
    /// metadata server), Azure by DefaultAzureCredential's order (environment and SAS,
    /// workload identity, managed identity, `az login`); docs/REMOTE.md.
    #[arg(long, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_NO_SIGN_REQUEST", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub no_sign_request: bool,
    /// Profile of the shared AWS files to take credentials and region from (default:
    /// $AWS_PROFILE, else `default`).
    #[arg(
        long,
        help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)",
        env = "LOOSEFS_PROFILE"
    )]
    pub profile: Option<String>,
    /// Allow plain `http://` URLs and endpoints (bytes unencrypted on the wire).
    #[arg(long, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_ALLOW_HTTP", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub allow_http: bool,
    /// PEM file of extra CA certificates to trust for https (default: $AWS_CA_BUNDLE).
    #[arg(
        long,
        help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)",
        env = "LOOSEFS_CA_BUNDLE"
    )]
    pub ca_bundle: Option<PathBuf>,
    /// Local block cache of remote packs: blocks fetched are kept here across mounts of the
    /// same object (keyed by URL and ETag) (default: `blocks/` under $LOOSEFS_CACHE_DIR, else
    /// $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs).
    #[arg(long, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)")]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache directory holds, e.g. 20G: this pack's blocks (at most its size)
    /// and other packs' (removed least recently used first) (default: what it holds now plus
    /// the free space of its file system, less 5% of that file system's size).
    #[arg(long, value_parser = parse_bytes, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_CACHE_SIZE")]
    pub cache_size: Option<u64>,
    /// Concurrent GETs of 1 MiB or more at most; smaller GETs count for less, down to 1/8 for
    /// 128 KiB or less (so up to 8× as many small objects are fetched at once).
    #[arg(long, default_value_t = remote_config::DEFAULT_MAX_REQUESTS, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_MAX_REQUESTS")]
    pub max_requests: usize,
    /// Most retries of a failed GET (5xx, SlowDown, reset, refused, timeout), with jittered
    /// exponential backoff from 100 ms up to 15 s, before the read answers EIO; the default is
    /// as many as fit in --retry-timeout, so an outage shorter than it fails no read.
    /// 403/404/412 are never retried.
    #[arg(long, default_value_t = remote_config::DEFAULT_RETRIES, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_RETRIES")]
    pub retries: usize,
    /// Longest time spent retrying one GET, seconds.
    #[arg(long, default_value_t = remote_config::DEFAULT_RETRY_TIMEOUT, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_RETRY_TIMEOUT")]
    pub retry_timeout: u64,
    /// Time limit of one GET, seconds.
    #[arg(long, default_value_t = remote_config::DEFAULT_REQUEST_TIMEOUT, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_REQUEST_TIMEOUT")]
    pub request_timeout: u64,
    /// Mount without reaching the server: from a complete block cache of the URL (every
    /// block of the samples and the index kept, closed cleanly by an earlier mount), at the
    /// ETag recorded there. No request is made; refused when the cache is not complete.
    #[arg(long, help_heading = "Remote sources (S3, GCS, Azure Blob, HTTPS)", env = "LOOSEFS_OFFLINE", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub offline: bool,
}

impl RemoteArgs {
    /// These options as the storage layer takes them.
    pub fn config(&self) -> RemoteConfig {
        RemoteConfig {
            endpoint_url: self.endpoint_url.clone(),
            region: self.region.clone(),
            request_payer: self.request_payer,
            billing_project: self.billing_project.clone(),
            no_sign_request: self.no_sign_request,
            profile: self.profile.clone(),
            allow_http: self.allow_http,
            ca_bundle: self.ca_bundle.clone(),
            cache_dir: self.cache_dir.clone(),
            cache_size: self.cache_size,
            max_requests: self.max_requests,
            retries: self.retries,
            retry_timeout: self.retry_timeout,
            request_timeout: self.request_timeout,
            offline: self.offline,
        }
    }
}

fn parse_format(s: &str) -> Result<crate::formats::Format, String> {
    crate::formats::Format::parse(s).ok_or_else(|| {
        format!(
            "unknown format {s:?}; known: webdataset, {}",
            crate::formats::Format::ALL.map(|f| f.name()).join(", ")
        )
    })
}

impl SourceArgs {
    /// The plain options the openers take (converted once, here: no clap type goes below
    /// the command line).
    pub fn open_options(&self) -> crate::open::OpenOptions {
        crate::open::OpenOptions {
            format: self.format,
            class_names: self.class_names.clone(),
            label: self.label.clone(),
            fields_all: self.fields == "all",
            verify_full: self.verify == "full",
            shared_index: self.shared_index.clone(),
            refresh_index: self.refresh_index,
            index_dir: self.index_dir.clone(),
            chunk_cache: self.chunk_cache,
            remote: self.remote.config(),
            probe_jpegs: self.probe_jpegs,
        }
    }
}

impl MountArgs {
    /// How the mount shows its progress: JSON lines with `--progress-lines`, else bars on a
    /// terminal.
    pub fn progress(&self) -> crate::progress::Progress {
        crate::progress::Progress::from_flags(self.progress_lines, false)
    }

    /// The plain options the launcher and daemon take, made once from the command line.
    ///
    /// Errors: `--decode` values no source can show together (see
    /// [`DecodeArgs::views`]).
    pub fn daemon_options(&self) -> anyhow::Result<DaemonOptions> {
        let views = (self.decode.views())
            .map_err(|e| crate::exit_code::with_kind(e, crate::exit_code::ExitKind::Usage))?;
        Ok(DaemonOptions {
            open: crate::open::OpenOptions {
                probe_jpegs: views.any(),
                ..self.source.open_options()
            },
            views,
            decode: self.decode.options(),
            readahead: ReadAheadOptions {
                window_max: self.prefetch_max_mb << 20,
                push_ahead: self.push_ahead,
                keep_cache: self.keep_pack_cache,
                pin: self.pin,
                order_window: self.order_window_mb << 20,
            },
            warm: self.warm,
            wait: self.wait,
            foreground: self.foreground,
            keeper: self.keeper,
            resend: self.resend,
            threads: self.threads,
            read_ahead_kb: self.read_ahead_kb,
            log: self.log.clone(),
            allow_other: self.allow_other,
            allow_non_empty: self.allow_non_empty,
            passthrough: self.passthrough == Passthrough::On,
            transport: match self.transport {
                Transport::Auto => crate::mount::Transport::Auto,
                Transport::Uring => crate::mount::Transport::Uring,
                Transport::Classic => crate::mount::Transport::Classic,
            },
            metrics_addr: self.metrics_addr,
            progress: self.progress(),
        })
    }
}

fn parse_pin(s: &str) -> Result<u64, String> {
    Ok(parse_size(s)?.unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `loosefs mount` flags as clap parses them (the flattened groups included).
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        m: MountArgs,
    }

    fn parse(args: &[&str]) -> Result<MountArgs, String> {
        use clap::Parser;
        let argv = std::iter::once("mount").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map(|c| c.m)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn mount_defaults_are_the_documented_ones() {
        let m = parse(&[]).unwrap();
        assert_eq!((m.threads, m.prefetch_max_mb, m.push_ahead), (16, 64, 64));
        assert_eq!(m.pin, None);
        assert_eq!(m.source.chunk_cache, 1 << 30);
        assert_eq!(m.decode.decode_cache, None);
        assert_eq!(m.decode.options().cache_bytes, 1 << 30);
        assert!(m.decode.options().frame_cache_bytes >= 256 << 20);
        // Retries outlast a short outage: up to 1000 tries within 120 s (docs/REMOTE.md).
        let r = &m.source.remote;
        assert_eq!(
            (
                r.retries,
                r.retry_timeout,
                r.request_timeout,
                r.max_requests
            ),
            (1000, 120, 60, 16)
        );
        assert!(m.decode.views().is_ok_and(|v| !v.any()));
    }

    #[test]
    fn sizes_views_formats_and_remote_flags_parse_or_are_refused_with_the_reason() {
        let m = parse(&[
            "--pin",
            "all",
            "--decode",
            "npy,ppm",
            "--decoded-only",
            "--chunk-cache",
            "512M",
            "--format",
            "webdataset",
            "--region",
            "eu-west-3",
            "--max-requests",
            "4",
            "--cache-size",
            "2GiB",
        ])
        .unwrap();
        assert_eq!(m.pin, Some(u64::MAX));
        assert_eq!(m.source.chunk_cache, 512 << 20);
        assert_eq!(m.source.format, Some(crate::formats::Format::Tar));
        assert_eq!(m.source.remote.region.as_deref(), Some("eu-west-3"));
        assert_eq!(m.source.remote.max_requests, 4);
        assert_eq!(m.source.remote.cache_size, Some(2 << 30));
        let v = m.decode.views().unwrap();
        assert!(v.npy && v.ppm && v.decoded_only);
        assert_eq!(parse(&["--pin", "8G"]).unwrap().pin, Some(8 << 30));
        for (args, want) in [
            (&["--pin", "8X"][..], "unknown size suffix"),
            (&["--format", "hdf5"], "known: webdataset"),
            (&["--chunk-cache", "all"], "give a size"),
            (&["--decode", "png"], "possible values"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let m = parse(&["--decoded-only"]).unwrap();
        assert!(
            m.decode
                .views()
                .unwrap_err()
                .to_string()
                .contains("--decode npy")
        );
    }
}
