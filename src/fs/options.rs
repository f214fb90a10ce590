//! How the filesystem serves: the plain options [`super::Fs`] takes (the command line's
//! `loosefs mount` options convert into them once, in [`crate::options`]).

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
