//! The index of a foreign dataset, built once and kept: a scan ([`super::Scan`]) becomes a loosefs
//! index (the same records a native pack carries: tree, sizes, CRC-32, JPEG dimensions) whose
//! `data_off` addresses the dataset's own files, stored in a cache directory under a name
//! derived from the source path and options. The next mount of the same source checks each
//! file's size and mtime (ns) against the index header and maps the index: no sample data is
//! read, however many samples there are.
//!
//! Building reads every sample once: its CRC-32 is computed (and checked against the
//! format's own CRC where it has one: zip's CRC-32, TFRecord's CRC-32C is checked by the scan)
//! so every later read is checked before it is served. The file is written to a temporary
//! name and renamed, so a crash never leaves an index that looks valid.
//!
//! Layout: `LOOSEFSX` | u32 version (1) | u32 0 | u64 header length | header JSON | zero pad to
//! 8 bytes | index (`docs/PACK-FORMAT.md`).

use super::{Format, ScanOptions};
use crate::catalog::ObjectInfo;
use crate::pack::index::IndexView;
use anyhow::{Context, Result};
use memmap2::Mmap;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod build;
mod file;
pub mod shared;
use build::build;
pub use file::load;
use file::write;

const MAGIC: &[u8; 8] = b"LOOSEFSX";
const VERSION: u32 = 2;

/// One file of the dataset as the index recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectEntry {
    /// The file (absolute).
    pub path: PathBuf,
    /// Size in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// When this object is a compressed chunk of the file: where and how.
    #[serde(default)]
    pub chunk: Option<super::ChunkSpec>,
    /// When the file was made from another (a `.tar` inflated from a `.tar.gz`): that file,
    /// whose size and mtime must match too.
    #[serde(default)]
    pub derived_from: Option<Box<ObjectEntry>>,
}

impl ObjectEntry {
    /// Bytes the object serves (decompressed, for a chunk).
    pub fn served_len(&self) -> u64 {
        self.chunk.as_ref().map_or(self.len, |c| c.len)
    }

    fn same_file(&self, now: &ObjectEntry) -> bool {
        self.path == now.path
            && self.len == now.len
            && self.mtime_ns == now.mtime_ns
            && self
                .derived_from
                .as_ref()
                .is_none_or(|d| object_entry(&d.path).is_ok_and(|n| d.same_file(&n)))
    }
}

/// The index file's header.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// The format the source was read as.
    pub format: Format,
    /// The source as given, canonicalised.
    pub source: PathBuf,
    /// The storage objects, in storage order ([`crate::catalog::ObjectId`] = position).
    pub objects: Vec<ObjectEntry>,
    /// Where object k starts in the records' `data_off` space.
    pub bases: Vec<u64>,
    /// As [`super::Scan::fields`].
    pub fields: Vec<String>,
    /// As [`super::Scan::compression`].
    pub compression: String,
    /// As [`super::Scan::labels`].
    pub labels: String,
    /// Class directories (0 when the tree mirrors an archive).
    pub classes: usize,
    /// Files shown (samples, and their other fields with `--fields all`).
    pub samples: usize,
    /// The options the index was built with (part of its key).
    pub options: String,
    /// A shared index ([`shared`]): `objects` are named relative to the dataset's root.
    #[serde(default)]
    pub relative: bool,
    /// A remote dataset's shared index: every object the dataset had when it was indexed
    /// (metadata files such as `index.json` included), as the listing or a GET pinned it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote: Vec<RemoteEntry>,
}

/// One object of a remote dataset as its shared index recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteEntry {
    /// The object's key relative to the dataset's URL (`shard.00000.mds`, `train/a.tar`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag as the server sent it (quotes included).
    pub etag: String,
    /// The object version (S3 versioned buckets), if reported.
    #[serde(default)]
    pub version: Option<String>,
}

/// The files of `h` once each (several chunks may come from one file).
fn distinct(h: &Header) -> impl Iterator<Item = &ObjectEntry> {
    let mut seen = std::collections::HashSet::new();
    h.objects.iter().filter(move |o| seen.insert(&o.path))
}

/// What `loosefs info` prints for a foreign dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForeignInfo {
    /// The source path.
    pub source: String,
    /// The format's name (`--format` spelling).
    pub format: String,
    /// Files shown, and those of them that are JPEGs with a readable header (0 when indexed
    /// from the tables alone, `verify` `table`: no header read).
    pub samples: u64,
    /// See `samples`.
    pub jpeg_samples: u64,
    /// Sum of the samples' sizes, bytes.
    pub sample_bytes: u64,
    /// Class directories (0: the archive's own tree is shown).
    pub classes: usize,
    /// The fields a sample has.
    pub fields: Vec<String>,
    /// How the samples are stored.
    pub compression: String,
    /// True when every file is served straight from the dataset's files (no copy).
    pub zero_copy: bool,
    /// How labels become class directories.
    pub labels: String,
    /// Files the samples are read from, and their total size in bytes.
    pub files: usize,
    /// See `files`.
    pub file_bytes: u64,
    /// The kept index file.
    pub index: String,
    /// True when this run built the index (false: loaded, no sample read).
    pub index_built_now: bool,
    /// How the samples are checked: `full` (every CRC-32 recorded at indexing), `lazy` (the
    /// format's own CRC-32s, else learned at the first read; JPEG headers read) or `table`
    /// (as lazy, indexed from the format's tables alone: no JPEG header read).
    pub verify: String,
    /// Samples whose CRC-32 is learned at their first read (the others' are the format's own
    /// or were recorded at indexing).
    pub crc_learned_on_read: usize,
}

impl ForeignInfo {
    /// The human-readable form.
    pub fn text(&self) -> String {
        format!(
            "source:        {}\nformat:        {}\nsamples:       {} ({}), {} bytes\nclasses:       {}\nlabels:        {}\nfields:        {}\ncompression:   {}\nzero-copy:     {}\nfiles:         {} ({} bytes)\nindex:         {}{}\nverify:        {} ({} sample(s) checked against the CRC-32 of their first read)\n",
            self.source,
            self.format,
            self.samples,
            if self.verify == "table" {
                "JPEG headers not read: indexed from the format's tables alone".to_string()
            } else {
                format!("{} JPEG", self.jpeg_samples)
            },
            self.sample_bytes,
            if self.classes == 0 {
                "none (the archive's own tree)".to_string()
            } else {
                self.classes.to_string()
            },
            self.labels,
            self.fields.join(", "),
            self.compression,
            if self.zero_copy {
                "yes (samples served from the dataset's own files)"
            } else {
                "no"
            },
            self.files,
            self.file_bytes,
            self.index,
            if self.index_built_now {
                " (built now)"
            } else {
                ""
            },
            self.verify,
            self.crc_learned_on_read,
        )
    }
}

/// An opened foreign dataset: its index, mapped.
#[derive(Debug)]
pub struct Foreign {
    /// The index file's header.
    pub header: Header,
    /// Where the index file is.
    pub path: PathBuf,
    /// True when this open built the index (false: loaded, no sample read).
    pub built: bool,
    /// The index file's mapping and the index bytes inside it.
    pub map: Arc<Mmap>,
    /// See `map`.
    pub index: Range<usize>,
}

impl Foreign {
    /// The storage objects, for the catalog.
    pub fn objects(&self) -> Vec<ObjectInfo> {
        self.header
            .objects
            .iter()
            .map(|o| ObjectInfo {
                path: o.path.clone(),
                len: o.served_len(),
                data_end: o.served_len(),
                align: 1,
            })
            .collect()
    }

    /// What `loosefs info` says of this dataset.
    pub fn info(&self) -> ForeignInfo {
        let v = self.view();
        let t = v.totals();
        let h = &self.header;
        ForeignInfo {
            source: h.source.display().to_string(),
            format: h.format.name().to_string(),
            samples: t.files,
            jpeg_samples: t.jpegs,
            sample_bytes: t.bytes,
            classes: h.classes,
            fields: h.fields.clone(),
            compression: h.compression.clone(),
            zero_copy: h.objects.iter().all(|o| o.chunk.is_none()),
            labels: h.labels.clone(),
            files: distinct(h).count(),
            file_bytes: distinct(h).map(|o| o.len).sum(),
            index: self.path.display().to_string(),
            index_built_now: self.built,
            verify: (h.options.rsplit_once("verify="))
                .map_or("full", |(_, v)| v)
                .to_string(),
            crc_learned_on_read: (0..t.records as u32)
                .filter_map(|i| v.record(i))
                .filter(|r| !r.is_dir && r.crc().is_none())
                .count(),
        }
    }

    /// The validated index.
    pub fn view(&self) -> IndexView<'_> {
        IndexView::parse(&self.map[self.index.clone()]).expect("validated when opened")
    }
}

/// The cache directory for indexes: `dir` if given, else `index/` under
/// [`crate::storage::cache_root`] (`$LOOSEFS_CACHE_DIR`, else `$XDG_CACHE_HOME/loosefs`, else
/// `~/.cache/loosefs`).
pub fn cache_dir(dir: Option<&Path>) -> PathBuf {
    match dir {
        Some(d) => d.to_path_buf(),
        None => crate::storage::cache_root().join("index"),
    }
}

/// A new temporary file in the index cache directory ([`cache_dir`] of `dir`, made if need
/// be), for an index fetched before it is known to be kept: removed when dropped unless kept.
///
/// Errors: the directory cannot be made or written (naming it).
pub fn temp_file(dir: Option<&Path>) -> Result<tempfile::NamedTempFile> {
    let dir = cache_dir(dir);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the index directory {}", dir.display()))?;
    tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("cannot write in {}", dir.display()))
}

fn object_entry(p: &Path) -> Result<ObjectEntry> {
    let m = std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok(ObjectEntry {
        path: p.to_path_buf(),
        len: m.len(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        chunk: None,
        derived_from: None,
    })
}

/// The `verify=` values of an index that serves a mount asked for `opts.verify`, preferred
/// first: a full index (every CRC-32 known) serves a lazy request too; an index built from the
/// format's tables alone (`table`: no JPEG dimensions) serves a lazy one without decoded views.
pub fn verify_accepted(opts: &ScanOptions) -> &'static [&'static str] {
    match (opts.verify, opts.tables_only, opts.views) {
        (super::Verify::Full, ..) => &["full"],
        (super::Verify::Lazy, true, _) => &["table", "lazy", "full"],
        (super::Verify::Lazy, false, false) => &["lazy", "full", "table"],
        (super::Verify::Lazy, false, true) => &["lazy", "full"],
    }
}

/// The options an index of `format` built with `opts` records in [`Header::options`] (part of
/// its key; a shared index is used only by a mount whose options give the same string).
pub fn options_string(format: Format, opts: &ScanOptions, verify: &str) -> String {
    format!(
        "format={};label={};fields-all={};class-names={};verify={verify}",
        format.name(),
        opts.label.as_deref().unwrap_or(""),
        opts.fields_all,
        opts.class_names
            .as_ref()
            .map(|v| v.join("\u{1f}"))
            .unwrap_or_default()
    )
}

/// Opens `src` as a foreign dataset: loads its kept index when every file it names still has
/// the recorded size and mtime, else scans the source and builds (and keeps) a new one.
/// `progress` shows what is being done and how far it is.
///
/// Errors: the format is not detected or the source is damaged (the message names the file);
/// a sample fails the format's own checksum; the cache directory cannot be written.
pub fn open(
    src: &Path,
    opts: &ScanOptions,
    cache: Option<&Path>,
    progress: crate::progress::Progress,
) -> Result<Foreign> {
    // A brace pattern (shards) does not exist as a path: its directory is made absolute.
    let src = match (super::brace_files(src), src.parent(), src.file_name()) {
        (Some(_), Some(dir), Some(name)) => dir
            .canonicalize()
            .with_context(|| format!("cannot read source {}", src.display()))?
            .join(name),
        _ => src
            .canonicalize()
            .with_context(|| format!("cannot read source {}", src.display()))?,
    };
    let format = match opts.format {
        Some(f) => f,
        None => super::detect(&src)?,
    };
    let wanted = verify_accepted(opts);
    let options_of = |verify: &str| options_string(format, opts, verify);
    let shared = match &opts.shared_index {
        super::SharedIndex::Off => None,
        super::SharedIndex::At(p) => Some((p.clone(), true)),
        super::SharedIndex::Auto => {
            Some((shared::default_path(&src), false)).filter(|(p, _)| p.is_file())
        }
    };
    if let Some((path, named)) = shared {
        let options: Vec<String> = wanted.iter().map(|v| options_of(v)).collect();
        match shared::load(&path, &src, &options)? {
            Some(f) => return Ok(f),
            None if named => anyhow::bail!(
                "the shared index {} was built with other options than this mount's ({})",
                path.display(),
                options[0]
            ),
            None => progress.note(&format!(
                "{} was built with other options; not used",
                path.display()
            )),
        }
    }
    let dir = cache_dir(cache);
    let path_of = |options: &str| {
        let key = xxhash_rust::xxh3::xxh3_64(
            format!("{}\u{0}{options}\u{0}v{VERSION}", src.display()).as_bytes(),
        );
        dir.join(format!("{key:016x}.lfx"))
    };
    for options in wanted.iter().map(|v| options_of(v)) {
        if let Ok(f) = load(&path_of(&options)) {
            let fresh = f
                .header
                .objects
                .iter()
                .all(|o| object_entry(&o.path).is_ok_and(|now| o.same_file(&now)))
                && f.header.options == options
                && f.header.source == src;
            if fresh {
                return Ok(f);
            }
        }
    }
    let options = options_of(wanted[0]);
    let path = path_of(&options);
    progress.note(&format!(
        "indexing {} ({}) once; the index is kept in {}",
        src.display(),
        format.name(),
        dir.display()
    ));
    let scanning = progress.spinner("scan", format!("{} ({})", src.display(), format.name()));
    let scan = super::scan(&src, format, opts);
    scanning.finish_and_clear();
    let (header, bytes) = build(&src, &scan?, opts, options, progress)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the index directory {}", dir.display()))?;
    write(&path, &header, &bytes)?;
    let mut f = load(&path).with_context(|| format!("cannot read back {}", path.display()))?;
    f.built = true;
    Ok(f)
}
