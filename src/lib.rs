//! loosefs: mount a packed machine-learning dataset so unmodified loaders see ordinary files.
//!
//! The read path, top down (`docs/DESIGN.md` walks it from a FUSE READ to bytes):
//! [`fuse`] (a thin fuser adaptor) → [`server`] (the router over backends: catalog, stored
//! samples, decoded views, control files) → [`catalog`] (what files exist and where their bytes
//! come from, an [`catalog::Extent`] per file) → [`readahead`] and [`samples`] (read-ahead in
//! storage order, checked reads) over [`storage`] (byte ranges of objects and their page
//! cache: local files, compressed chunks in `storage/chunks/`, remote objects through the
//! block cache in `storage/block_cache/`) → [`decode`] for decoded views.
//!
//! What is served: [`dataset`] opens any source: a native pack ([`format`], the pack format;
//! `pack/index/` its tree check, `pack/writer/` its zip records), a pack at a URL ([`remote`]), or a dataset in another
//! packed format ([`formats`]: one scanner per format, their fixture tests in `formats/mds/`,
//! `formats/litdata/`, `formats/ffcv/`, `formats/parquet/`, and the kept index in
//! `formats/index/`).
//!
//! Beside it: [`ino`] (inode spaces), [`view`] (view geometry), [`stats`] and [`report`]
//! (counters and the typed reports), [`memory`] (budgets), [`options`] and [`mount`] (the
//! daemon's options and lifecycle; `mount/` the FUSE session), [`client`] (the `stats`,
//! `warm`, `drop-cache` commands), [`packer`] (`pack`, reading a [`source`] tree or zip;
//! `source/` the zip walk and the tests) and [`verify`] (`verify`, `info`).

pub mod catalog;
pub mod client;
pub mod decode;
pub mod formats;
pub mod fs;
pub mod fuse;
pub mod ino;
pub mod memory;
pub mod metrics;
pub mod mount;
pub mod open;
pub mod options;
pub mod pack;
pub mod packer;
pub mod readahead;
pub mod report;
pub mod samples;
pub mod source;
pub mod stats;
pub mod storage;
#[cfg(test)]
mod testutil;
pub mod verify;
pub mod view;
