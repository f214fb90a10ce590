//! loosefs: mount a packed machine-learning dataset so unmodified loaders see ordinary files.
//!
//! Layers, bottom up: [`format`] (the pack: a ZIP64 archive plus a fixed-record index),
//! [`namespace`] (inodes, lookups, listings and checked reads, testable without a mount),
//! [`fuse`] (a thin fuser adaptor), [`mount`] (daemon lifecycle), and the commands
//! [`packer`] (`pack`, reading a [`source`] tree or zip) and [`verify`] (`verify`, `info`).

pub mod format;
pub mod fuse;
pub mod mount;
pub mod namespace;
pub mod packer;
pub mod source;
pub mod verify;
