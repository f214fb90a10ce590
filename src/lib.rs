//! loosefs: mount a packed machine-learning dataset so unmodified loaders see ordinary files.
//!
//! The folders say where things live (`docs/DESIGN.md` lists every file and walks a FUSE READ
//! down to bytes):
//! - [`fuse`]: the FUSE transports, translation only: the fuser adaptor (`/dev/fuse`) and
//!   `fuse/uring/` (FUSE over io_uring), side by side, both calling one [`fs::Fs`].
//! - [`fs`]: the filesystem, free of FUSE types: the router over backends (catalog files,
//!   decoded views, the `.loosefs/` control files, a directory mount's live changes).
//! - [`open`]: where every source is opened, one file per kind (a pack, a foreign dataset, a
//!   directory, a pack or a dataset at a URL), each ending in one [`open::Opened`]: what the
//!   source is, nothing served.
//! - [`catalog`]: what files exist and where their bytes come from (an [`catalog::Extent`]
//!   per file); [`samples`]: checked reads; [`readahead`]: read-ahead, push, pin, warm and
//!   announced orders; [`decode`]: decoded views of JPEGs; [`video`]: video datasets as
//!   frames (LeRobot, plain video files).
//! - [`storage`]: where bytes are read and cached: local files, compressed chunks, remote
//!   objects through the block cache, behind the [`storage::object::source::ObjectSource`] and
//!   [`storage::object::source::ObjectStore`] seams.
//! - [`pack`]: the native pack format; [`formats`]: every other packed format (one scanner
//!   each, a registry, the kept index).
//! - Commands: [`mount`] (the daemon's lifecycle, and `mount::compose`, which builds what is
//!   served from an opened source), [`packer`] with [`source`] (`pack`), [`verify`]
//!   (`verify`, `info`), [`client`] (`stats`, `warm`, `drop-cache`), [`csi`] (the Kubernetes
//!   CSI driver); [`options`] holds the command line's clap types, converted once into plain
//!   options ([`mount::DaemonOptions`], [`open::OpenOptions`]).
//! - Shared leaves: [`ino`] (inode spaces), [`view`] (view geometry), [`stats`], [`report`]
//!   and [`metrics`] (counters and reports), [`memory`] (budgets), [`progress`] (bars or JSON
//!   lines), [`mount_table`] (the mount table, read without asking a mount), [`exit_code`]
//!   (exit codes by kind of failure).

/// `eprintln!` that never panics: a standard error that cannot be written (a pipe whose reader
/// went away, `2>/dev/full`) loses the line, not the process (`eprintln!` would panic after a
/// mount was made, and the caller would see a crash).
#[macro_export]
macro_rules! eprintln_lossy {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

pub mod catalog;
pub mod client;
pub mod csi;
pub mod decode;
pub mod exit_code;
pub mod formats;
pub mod fs;
pub mod fuse;
pub mod ino;
pub mod memory;
pub mod metrics;
pub mod mount;
pub mod mount_table;
pub mod open;
pub mod options;
pub mod pack;
pub mod packer;
pub mod progress;
pub mod readahead;
pub mod report;
pub mod samples;
pub mod source;
pub mod stats;
pub mod storage;
#[cfg(test)]
mod testutil;
pub mod verify;
pub mod video;
pub mod view;
