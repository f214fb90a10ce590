//! The formats loosefs reads, one entry each: its name and aliases, how its content is
//! recognised, how it is scanned, and what it accepts. Adding a format is its file (sniff,
//! scan) plus a variant of [`Format`] and one entry here.

use super::{Format, Scan, ScanOptions};
use anyhow::Result;
use std::path::Path;

/// One format.
pub(super) struct FormatEntry {
    /// The variant.
    pub format: Format,
    /// The name `--format` takes and `info` prints.
    pub name: &'static str,
    /// Other names `--format` takes.
    pub aliases: &'static [&'static str],
    /// Whether `src` is in this format, else why not (detection tries [`Format::ALL`] in order).
    pub sniff: fn(&Path) -> std::result::Result<(), String>,
    /// Scans `src` (the label field, the inflate directory and tables-only taken from the
    /// options where the format uses them).
    pub scan: fn(&Path, &ScanOptions) -> Result<Scan>,
    /// Whether `--label` can name another label field.
    pub takes_label: bool,
    /// Whether a dataset of it is a directory of its own (metadata beside the shards).
    pub directory: bool,
    /// The endings of its shards' names: a prefix of objects whose names end so (and nothing
    /// else) is a dataset of it, not loose files (`open/remote_dir.rs`).
    pub shard_extensions: &'static [&'static str],
}

/// Every format.
pub(super) const REGISTRY: [FormatEntry; 8] = [
    FormatEntry {
        format: Format::Tar,
        name: "tar",
        aliases: &["webdataset", "wds"],
        sniff: super::tar::sniff,
        scan: |src, o| super::tar::scan(src, o.label.as_deref(), &o.inflate_dir),
        takes_label: true,
        directory: false,
        shard_extensions: &[".tar"],
    },
    FormatEntry {
        format: Format::Zip,
        name: "zip",
        aliases: &[],
        sniff: super::zip::sniff,
        scan: |src, o| match o.tables_only {
            true => super::zip::table::scan(src),
            false => super::zip::scan(src),
        },
        takes_label: false,
        directory: false,
        shard_extensions: &[".zip"],
    },
    FormatEntry {
        format: Format::Tfrecord,
        name: "tfrecord",
        aliases: &[],
        sniff: super::tfrecord::sniff,
        scan: |src, o| super::tfrecord::scan(src, o.label.as_deref()),
        takes_label: true,
        directory: false,
        shard_extensions: &[".tfrecord", ".tfrecords"],
    },
    FormatEntry {
        format: Format::Mds,
        name: "mds",
        aliases: &[],
        sniff: super::mds::sniff,
        scan: |src, o| super::mds::scan(src, o.label.as_deref()),
        takes_label: true,
        directory: true,
        shard_extensions: &[".mds"],
    },
    FormatEntry {
        format: Format::Litdata,
        name: "litdata",
        aliases: &[],
        sniff: super::litdata::sniff,
        scan: |src, _| super::litdata::scan(src),
        takes_label: false,
        directory: true,
        shard_extensions: &[],
    },
    FormatEntry {
        format: Format::Gulpio,
        name: "gulpio",
        aliases: &[],
        sniff: super::gulpio::sniff,
        scan: |src, _| super::gulpio::scan(src),
        takes_label: false,
        directory: true,
        shard_extensions: &[".gulp"],
    },
    FormatEntry {
        format: Format::Ffcv,
        name: "ffcv",
        aliases: &[],
        sniff: super::ffcv::sniff,
        scan: |src, _| super::ffcv::scan(src),
        takes_label: false,
        directory: false,
        shard_extensions: &[".beton"],
    },
    FormatEntry {
        format: Format::Parquet,
        name: "parquet",
        aliases: &["hf-parquet", "huggingface"],
        sniff: super::parquet::sniff,
        scan: |src, o| super::parquet::scan(src, o.label.as_deref()),
        takes_label: true,
        directory: false,
        shard_extensions: &[".parquet"],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_one_entry_and_every_name_one_format() {
        for f in Format::ALL {
            assert_eq!(
                REGISTRY.iter().filter(|e| e.format == f).count(),
                1,
                "{f:?}"
            );
        }
        let mut names: Vec<&str> = REGISTRY
            .iter()
            .flat_map(|e| std::iter::once(e.name).chain(e.aliases.iter().copied()))
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a name or alias used twice");
    }
}
