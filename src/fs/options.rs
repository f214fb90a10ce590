//! How the filesystem serves: the plain options [`super::Fs`] takes (a mount's are made once
//! from its [`crate::mount::DaemonOptions`], `DaemonOptions::fs_options`; a filesystem served
//! with no mount takes [`FsOptions::in_process`]).

use crate::decode::DecodeOptions;
use crate::readahead::ReadAheadOptions;

/// How the daemon serves.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Read-ahead, push-ahead, release and pinning.
    pub readahead: ReadAheadOptions,
    /// Start a whole-pack warm at mount.
    pub warm: bool,
    /// Mountpoint (for stats).
    pub mountpoint: String,
    /// FUSE threads (for stats).
    pub threads: usize,
    /// The daemon's log file (for stats; `-`: its stderr).
    pub log: String,
    /// The mount's owner (the user who mounted it): with root, the only user who may run the
    /// control commands.
    pub owner: u32,
    /// Decode pool and cache, used when the catalog shows decoded views.
    pub decode: DecodeOptions,
    /// Let the kernel read whole backing files itself where the storage has them.
    pub passthrough: bool,
}

impl FsOptions {
    /// The options of a filesystem served in process, with no mount (tests, the fuzz
    /// targets, tools): read-ahead windows of 1 MiB and 4 KiB along an order, nothing pushed
    /// or kept, decode caches of 1 MiB on one thread without decode-ahead, one FUSE thread,
    /// owner uid 0, mountpoint `/m`, log on stderr. Override the fields a caller needs.
    pub fn in_process() -> FsOptions {
        FsOptions {
            readahead: ReadAheadOptions {
                window_max: 1 << 20,
                push_ahead: 0,
                keep_cache: false,
                pin: None,
                order_window: 4096,
            },
            warm: false,
            mountpoint: "/m".into(),
            threads: 1,
            log: "-".into(),
            owner: 0,
            decode: DecodeOptions {
                cache_bytes: 1 << 20,
                frame_cache_bytes: 1 << 20,
                threads: 1,
                ahead: 0,
                accept_damaged: false,
            },
            passthrough: false,
        }
    }
}
