//! What a mount is made and served with: one plain value ([`DaemonOptions`]), made once from
//! the command line by the CLI layer (`crate::options::MountArgs::daemon_options`), the only
//! thing the daemon's steps read. No command-line type reaches below it (as mountpoint-s3's
//! CLI builds its `MountpointConfig` before it composes).

use crate::decode::DecodeOptions;
use crate::fs::FsOptions;
use crate::open::OpenOptions;
use crate::readahead::ReadAheadOptions;
use crate::view::Views;
use std::path::{Path, PathBuf};

/// How the kernel's requests reach the daemon (`--transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it, else `/dev/fuse`.
    Auto,
    /// FUSE over io_uring, or the mount fails.
    Uring,
    /// `/dev/fuse` reads and writes, one pair per request.
    Classic,
}

/// Everything a mount's launcher and daemon need, decided once.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// How the source is opened (`probe_jpegs` set when a decoded view is asked).
    pub open: OpenOptions,
    /// The decoded views asked for (a source's kind may refuse some: `Dataset::views`).
    pub views: Views,
    /// The decoders' budgets and threads.
    pub decode: DecodeOptions,
    /// Read-ahead, push-ahead, page-cache keeping, pin.
    pub readahead: ReadAheadOptions,
    /// Read the whole source into the page cache once mounted.
    pub warm: bool,
    /// `loosefs mount` waits for the pin and warm to finish.
    pub wait: bool,
    /// Serve in this process (else a daemon is launched in the background).
    pub foreground: bool,
    /// Keep the mount across daemon deaths (`None`: the default for how it is started).
    pub keeper: Option<bool>,
    /// A kept mount's keeper resends what a dead daemon had read (FUSE_NOTIFY_RESEND).
    pub resend: bool,
    /// FUSE threads.
    pub threads: usize,
    /// The mount's `read_ahead_kb` in the kernel's BDI (0: left as the kernel sets it).
    pub read_ahead_kb: u32,
    /// `--log`: the daemon's log file, `-` for the launcher's stderr, `None` for the default
    /// ([`crate::mount_table::default_log_path`]).
    pub log: Option<PathBuf>,
    /// Other users may use the mount.
    pub allow_other: bool,
    /// A mountpoint holding files is accepted.
    pub allow_non_empty: bool,
    /// Passthrough opens where the kernel and privileges allow them.
    pub passthrough: bool,
    /// How requests reach the daemon.
    pub transport: Transport,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How progress is shown (bars, JSON lines, quiet).
    pub progress: crate::progress::Progress,
}

impl DaemonOptions {
    /// Whether `--log -` keeps the daemon's log on the stderr `loosefs mount` was given.
    pub fn logs_to_stderr(&self) -> bool {
        self.log.as_deref() == Some(Path::new("-"))
    }

    /// The daemon's log for a mount at `mnt`: `--log`, else the default
    /// ([`crate::mount_table::default_log_path`]).
    pub fn log_path(&self, mnt: &Path) -> PathBuf {
        match &self.log {
            Some(p) => p.clone(),
            None => crate::mount_table::default_log_path(mnt),
        }
    }

    /// What the filesystem is told, for a mount at `mountpoint` (resolved before the mount
    /// covers it: a lookup of its own root would wait on this daemon).
    pub fn fs_options(&self, mountpoint: &Path) -> FsOptions {
        FsOptions {
            readahead: self.readahead,
            warm: self.warm,
            mountpoint: crate::mount_table::resolve_mountpoint(mountpoint)
                .or_else(|_| std::path::absolute(mountpoint))
                .unwrap_or_else(|_| mountpoint.to_path_buf())
                .display()
                .to_string(),
            threads: self.threads,
            log: self.log_path(mountpoint).display().to_string(),
            owner: nix::unistd::geteuid().as_raw(),
            decode: self.decode,
            passthrough: self.passthrough,
        }
    }
}
