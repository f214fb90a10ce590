//! loosefs: mount a packed machine-learning dataset so unmodified loaders see ordinary files.
//!
//! Layers, bottom up: [`format`] (the pack: a ZIP64 archive plus a fixed-record index),
//! [`namespace`] (inodes, lookups, listings and checked reads, testable without a mount),
//! [`server`] (the namespace plus [`stats`], [`prefetch`], [`pagecache`] pinning, [`warm`] and
//! the [`control`] directory, and [`decode`]d views), [`fuse`] (a thin fuser adaptor), [`mount`] (daemon lifecycle), and the commands
//! [`packer`] (`pack`, reading a [`source`] tree or zip) and [`verify`] (`verify`, `info`).

pub mod client;
pub mod control;
pub mod decode;
pub mod format;
pub mod fuse;
pub mod mount;
pub mod namespace;
pub mod packer;
pub mod pagecache;
pub mod prefetch;
pub mod server;
pub mod source;
pub mod stats;
pub mod verify;
pub mod warm;
