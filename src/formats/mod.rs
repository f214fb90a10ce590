//! Foreign packed formats (WebDataset/tar, zip, TFRecord, MDS, LitData, GulpIO, FFCV, HF Parquet): detect a
//! source's format, scan it once into [`Scan`] (every sample as a byte range of one of the
//! format's files, with its label and class name), and name the ImageFolder tree the mount
//! shows. [`index`] turns a scan into a loosefs index kept in a cache directory, so the next
//! mount of an unchanged source reads no sample data.
//!
//! Layouts follow `../shared/research/formats.md` (checked byte by byte against the real
//! writers' output); each parser's module doc names its source.

mod bytes;
pub mod ffcv;
pub mod gulpio;
#[cfg(test)]
mod hostile;
pub mod index;
pub mod litdata;
pub mod mds;
pub mod parquet;
mod registry;
pub mod tar;
pub mod tfrecord;
pub mod zip;

use anyhow::{Context, Result, bail};
pub(crate) use bytes::{Le, consecutive, offset_table};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A packed format loosefs can mount besides its own packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// WebDataset shards or any tar archive (uncompressed).
    Tar,
    /// A zip archive (stored members).
    Zip,
    /// TFRecord files of `tf.train.Example` records (uncompressed).
    Tfrecord,
    /// A MosaicML Streaming (MDS) directory: `index.json` + shards.
    Mds,
    /// A LitData directory: `index.json` + chunks.
    Litdata,
    /// A GulpIO directory: `data_N.gulp` + `meta_N.gmeta`.
    Gulpio,
    /// An FFCV `.beton` file.
    Ffcv,
    /// Hugging Face `datasets` Parquet files (uncompressed image column).
    Parquet,
}

impl Format {
    /// Every format, in the order detection tries them.
    pub const ALL: [Format; 8] = [
        Format::Ffcv,
        Format::Parquet,
        Format::Mds,
        Format::Litdata,
        Format::Gulpio,
        Format::Tfrecord,
        Format::Tar,
        Format::Zip,
    ];

    /// The name `--format` takes and `info` prints.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// Parses a `--format` value: a name or an alias (`webdataset` is `tar`).
    pub fn parse(s: &str) -> Option<Format> {
        registry::REGISTRY
            .iter()
            .find(|e| e.name == s || e.aliases.contains(&s))
            .map(|e| e.format)
    }

    /// The format's entry in the registry.
    fn entry(self) -> &'static registry::FormatEntry {
        registry::REGISTRY
            .iter()
            .find(|e| e.format == self)
            .expect("every format has an entry (checked by a test)")
    }

    /// Whether a dataset of this format is a directory of its own (an `index.json` or
    /// metadata files beside the shards), never a tree to pack as it is.
    pub fn is_directory_dataset(self) -> bool {
        self.entry().directory
    }

    /// Other names `--format` takes for it.
    pub fn aliases(self) -> &'static [&'static str] {
        self.entry().aliases
    }

    /// Whether `--label` can name another label field of it.
    pub fn takes_label(self) -> bool {
        self.entry().takes_label
    }

    /// The endings of its shards' names (`.tar`; none for a format whose shards have no
    /// ending of their own).
    pub fn shard_extensions(self) -> &'static [&'static str] {
        self.entry().shard_extensions
    }
}

/// One sample found by a scan.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Index of the file holding it among [`Scan::objects`].
    pub object: u32,
    /// Byte range of the file's content inside that object.
    pub range: Range<u64>,
    /// The format's integer label, as stored.
    pub label: Option<i64>,
    /// The format's class name for this sample, when it has one.
    pub class: Option<String>,
    /// For archives mirrored as trees (zip, plain tar): the directory path inside the archive
    /// ("" at the top); `label`/`class` are then unused.
    pub dir: Option<String>,
    /// File name shown (key + extension).
    pub name: String,
    /// CRC-32 (IEEE) of the content when the format stores it (zip); otherwise computed once
    /// while the index is built.
    pub crc32: Option<u32>,
    /// Modification time shown, seconds since the epoch (the object's when the format has
    /// none per sample).
    pub mtime: i64,
    /// The sample's other fields stored in place in the same object (WebDataset members, TFRecord
    /// bytes features, MDS columns): (field name, byte range). Shown as `<stem>.<field>` beside
    /// the image with `--fields all`.
    pub extra: Vec<(String, Range<u64>)>,
    /// When the content is raw RGB pixels (row-major, 3 bytes each) rather than an encoded
    /// image: (width, height). Served behind a PPM header (`.npy` with `--decode npy`).
    pub pixels: Option<(u32, u32)>,
}

/// What a scan of one source found.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The format scanned.
    pub format: Format,
    /// The files holding the samples, in storage order.
    pub objects: Vec<PathBuf>,
    /// Per object, when it is a compressed chunk of its file: how to get its bytes (samples'
    /// ranges are then offsets in the decompressed bytes). Empty: every object is plain.
    pub chunks: Vec<Option<ChunkSpec>>,
    /// Every sample, in storage order.
    pub samples: Vec<Sample>,
    /// The fields (members, columns, features) a sample has, for `info`.
    pub fields: Vec<String>,
    /// How the samples are stored, for `info` (e.g. "none", "zstd").
    pub compression: String,
    /// How the format's labels map to directories, for `info` and docs/FORMATS.md.
    pub labels: String,
    /// Objects made from another file (a `.tar` inflated from a `.tar.gz`): (object, source).
    pub derived: Vec<(PathBuf, PathBuf)>,
}

/// A compressed chunk: bytes `offset..offset + stored_len` of its file, `len` bytes once
/// decompressed with `codec`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkSpec {
    /// How the bytes are compressed.
    pub codec: crate::storage::chunks::Codec,
    /// Where the compressed bytes start in the file, bytes.
    pub offset: u64,
    /// Compressed length, bytes.
    pub stored_len: u64,
    /// Decompressed length, bytes.
    pub len: u64,
    /// CRC-32 of the decompressed bytes, when the container has one (zip).
    pub crc32: Option<u32>,
    /// Parquet row-group chunks: the row group and the image column's group name.
    #[serde(default)]
    pub parquet: Option<(usize, String)>,
}

impl ChunkSpec {
    /// The chunk of file `path`, opened on its own.
    pub fn open(&self, path: &Path) -> std::io::Result<crate::storage::chunks::Chunk> {
        Ok(self.with_file(path, std::sync::Arc::new(std::fs::File::open(path)?)))
    }

    /// The chunk of file `path`, read through `file` (shared with the file's other chunks).
    pub fn with_file(
        &self,
        path: &Path,
        file: std::sync::Arc<std::fs::File>,
    ) -> crate::storage::chunks::Chunk {
        crate::storage::chunks::Chunk {
            path: path.to_path_buf(),
            file: crate::storage::chunks::ChunkFile::Local(file),
            range: self.offset..self.offset + self.stored_len,
            codec: self.codec,
            len: self.len,
            crc32: self.crc32,
            parquet: self.parquet.clone(),
        }
    }
}

impl ChunkSpec {
    /// The chunk of file `path` whose bytes are object `obj` of `storage` (a remote shard
    /// through its block cache).
    pub fn with_stored(
        &self,
        path: &Path,
        storage: std::sync::Arc<dyn crate::storage::Storage>,
        obj: crate::catalog::ObjectId,
    ) -> crate::storage::chunks::Chunk {
        crate::storage::chunks::Chunk {
            path: path.to_path_buf(),
            file: crate::storage::chunks::ChunkFile::Stored(storage, obj),
            range: self.offset..self.offset + self.stored_len,
            codec: self.codec,
            len: self.len,
            crc32: self.crc32,
            parquet: self.parquet.clone(),
        }
    }
}

/// Options that change what a scan shows (part of the cached index's key).
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Forces the format instead of detecting it.
    pub format: Option<Format>,
    /// Class names by label, one per line (see [`name_classes`]).
    pub class_names: Option<Vec<String>>,
    /// The field holding the label (a WebDataset extension, a TFRecord feature, an MDS or
    /// Parquet column), instead of the format's usual one.
    pub label: Option<String>,
    /// Show every field of a sample as a file, not only the image (`--fields all`).
    pub fields_all: bool,
    /// Where files made from the source (an inflated `.tar.gz`) go: the index directory.
    pub inflate_dir: PathBuf,
    /// How much of each sample indexing reads (`--verify`).
    pub verify: Verify,
    /// Which shared index to use ([`index::shared`]).
    pub shared_index: SharedIndex,
    /// Decoded views are asked for: the index needs every JPEG's dimensions (an index built
    /// from the tables alone has none).
    pub views: bool,
    /// Index from the format's own tables alone, reading no sample (a zip's central
    /// directory, an FFCV file's metadata and allocation tables): JPEG dimensions stay
    /// unknown, so no decoded view. Set by the index build of a dataset at a URL
    /// ([`crate::open::remote_dataset`]), which has fetched only those tables; other formats scan
    /// as usual.
    pub tables_only: bool,
}

/// Which shared index ([`index::shared`]) a mount uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SharedIndex {
    /// The one beside the dataset (`<SRC>.loosefs-index`) when it exists and its options fit.
    #[default]
    Auto,
    /// This one (`--index PATH`): refused when stale or built with other options.
    At(PathBuf),
    /// None: the local index (kept in `--index-dir`) or a scan (`loosefs index` itself).
    Off,
}

/// How a foreign dataset's samples are checked (`--verify`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Verify {
    /// Indexing reads each sample's head only (its first 16 KiB, more when a JPEG's frame
    /// header lies further: the dimensions decoded views need): a sample is
    /// checked against the format's own checksum when it has one (zip CRC-32, TFRecord
    /// CRC-32C at scan), else its CRC-32 is recorded at its first read and every later read
    /// must match it.
    #[default]
    Lazy,
    /// Indexing reads every sample once (its CRC-32 recorded, the format's checksums checked)
    /// before the mount serves any.
    Full,
}

/// Detects the format of `src` from its content (file magic, `index.json` keys, file
/// names). Errors: nothing matched; the message lists what was tried and why each failed.
pub fn detect(src: &Path) -> Result<Format> {
    use crate::exit_code::{ExitKind::Damaged, with_kind};
    // A missing source is said as such (and exits as not found), not as every format's miss.
    std::fs::symlink_metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
    detect_in(src).map_err(|e| with_kind(e, Damaged))
}

fn detect_in(src: &Path) -> Result<Format> {
    let mut tried = Vec::new();
    for f in Format::ALL {
        match sniff(f, src) {
            Ok(()) => return Ok(f),
            Err(why) => tried.push(format!("{}: {why}", f.name())),
        }
    }
    if looks_like_dataset(src) {
        bail!(
            "{} looks like a dataset (an index.json, or only shard files) but no format loosefs reads accepts it; tried:\n  {}",
            src.display(),
            tried.join("\n  ")
        )
    }
    if src.is_dir() {
        bail!(
            "{d} is a plain directory, not a dataset in a packed format: pack it first with `loosefs pack {d} OUT.pack`, then `loosefs mount OUT.pack MOUNTPOINT`. Formats tried:\n  {}",
            tried.join("\n  "),
            d = src.display(),
        )
    }
    bail!(
        "{} is not a directory, a loosefs pack, a zip archive, nor a dataset in a format loosefs reads; tried:\n  {}",
        src.display(),
        tried.join("\n  ")
    )
}

fn sniff(f: Format, src: &Path) -> std::result::Result<(), String> {
    (f.entry().sniff)(src)
}

/// Scans `src` as `format`. Errors: the source is damaged or uses a feature loosefs does not
/// serve (compressed chunks); the message names the file and what is wrong.
pub fn scan(src: &Path, format: Format, opts: &ScanOptions) -> Result<Scan> {
    scan_checked(src, format, opts).map_err(|e| crate::exit_code::as_damaged(e, src))
}

fn scan_checked(src: &Path, format: Format, opts: &ScanOptions) -> Result<Scan> {
    let label = opts.label.as_deref();
    if label.is_some() && !format.entry().takes_label {
        return Err(crate::exit_code::refuse(
            crate::exit_code::ExitKind::Usage,
            format!(
                "--label: {} has one label field; it takes no other",
                format.name()
            ),
        ));
    }
    let mut s = (format.entry().scan)(src, opts)?;
    // Every other field as a file beside the image: `<stem>.<field>`.
    if opts.fields_all {
        let mut out = Vec::with_capacity(s.samples.len() * 2);
        for mut x in std::mem::take(&mut s.samples) {
            let extra = std::mem::take(&mut x.extra);
            let stem = match x.name.rfind('.') {
                Some(i) => x.name[..i].to_string(),
                None => x.name.clone(),
            };
            let base = x.clone();
            out.push(x);
            for (field, range) in extra {
                out.push(Sample {
                    range,
                    name: format!("{stem}.{}", field.replace('/', "_")),
                    crc32: None,
                    ..base.clone()
                });
            }
        }
        s.samples = out;
    }
    // Every range must lie inside its object: a damaged index fails here, naming the file.
    s.chunks.resize(s.objects.len(), None);
    let lens: Vec<u64> = s
        .objects
        .iter()
        .zip(&s.chunks)
        .map(|(p, c)| match c {
            Some(c) => Ok(c.len),
            None => std::fs::metadata(p).map(|m| m.len()),
        })
        .collect::<std::io::Result<_>>()?;
    for smp in &s.samples {
        let Some(len) = lens.get(smp.object as usize) else {
            bail!("{}: sample {} names no file", src.display(), smp.name);
        };
        if smp.range.start > smp.range.end || smp.range.end > *len {
            bail!(
                "{}: sample {} lies at bytes {}..{}, past the end of the file ({len} bytes)",
                s.objects[smp.object as usize].display(),
                smp.name,
                smp.range.start,
                smp.range.end
            );
        }
    }
    if s.samples.is_empty() {
        bail!(
            "{}: no samples found ({} format)",
            src.display(),
            s.format.name()
        );
    }
    s.samples
        .iter_mut()
        .for_each(|x| x.name = safe_name(&x.name));
    Ok(s)
}

/// Whether directory `dir` is meant as a dataset even if no format accepts it: it holds an
/// `index.json` (MDS, LitData), or only files, some of them shards (`.tar`, `.tfrecord`,
/// `.gmeta`).
pub fn looks_like_dataset(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<(String, bool)> = rd
        .filter_map(|e| e.ok())
        .map(|e| {
            let sub = e.file_type().is_ok_and(|t| t.is_dir());
            (e.file_name().to_string_lossy().into_owned(), sub)
        })
        .collect();
    let shard = |n: &str| n.ends_with(".tar") || n.ends_with(".tfrecord") || n.ends_with(".gmeta");
    names.iter().any(|(n, _)| n == "index.json")
        || (!names.is_empty()
            && names.iter().all(|(_, d)| !d)
            && names.iter().any(|(n, _)| shard(n)))
}

/// Longest name a directory entry may have, bytes (Linux `NAME_MAX`; the kernel refuses a
/// listing that holds a longer one).
pub const NAME_MAX: usize = 255;

/// A file or directory name safe to show: no `/` or NUL, not `.` or `..`, not empty, at most
/// [`NAME_MAX`] bytes (a longer one keeps its start and its extension around a hash of the
/// whole name, so it stays unique and loaders still see its type).
pub fn safe_name(n: &str) -> String {
    let s: String = n
        .chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect();
    let s = match s.as_str() {
        "" | "." | ".." => format!("_{s}"),
        _ => s,
    };
    if s.len() <= NAME_MAX {
        return s;
    }
    let ext = s
        .rsplit_once('.')
        .map(|(_, e)| e)
        .filter(|e| !e.is_empty() && e.len() <= 16)
        .map_or(String::new(), |e| format!(".{e}"));
    let tag = format!("~{:016x}", xxhash_rust::xxh3::xxh3_64(s.as_bytes()));
    let mut keep = NAME_MAX - tag.len() - ext.len();
    while !s.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{tag}{ext}", &s[..keep])
}

/// The directory path (components) each sample goes in: the archive's own directories when the
/// scan mirrors a tree; else one class directory per label, named so that sorted order is label
/// order (what ImageFolder numbers classes by): the class names themselves when every label has
/// one distinct name and sorting the names keeps label order, else `NNNN_name`, else `NNNN`
/// (zero-padded label, as stored). `class_names` (from `--class-names`, line i = the i-th
/// smallest label) overrides the format's names. Unlabelled samples of a labelled set go in
/// `unlabelled/`.
pub fn name_classes(samples: &[Sample], class_names: Option<&[String]>) -> Vec<Vec<String>> {
    if samples.iter().all(|s| s.dir.is_some()) {
        return samples
            .iter()
            .map(|s| {
                s.dir
                    .as_deref()
                    .unwrap_or("")
                    .split('/')
                    .filter(|c| !c.is_empty())
                    .map(safe_name)
                    .collect()
            })
            .collect();
    }
    let mut names: BTreeMap<i64, HashSet<&str>> = BTreeMap::new();
    for s in samples {
        if let Some(l) = s.label {
            let e = names.entry(l).or_default();
            if let Some(c) = &s.class {
                e.insert(c.as_str());
            }
        }
    }
    let labels: Vec<i64> = names.keys().copied().collect();
    let given: HashMap<i64, String> = match class_names {
        Some(list) => labels
            .iter()
            .zip(list)
            .map(|(l, n)| (*l, safe_name(n)))
            .collect(),
        None => names
            .iter()
            .filter(|(_, set)| set.len() == 1)
            .map(|(l, set)| (*l, safe_name(set.iter().next().unwrap_or(&""))))
            .collect(),
    };
    let width = labels
        .iter()
        .map(|l| l.unsigned_abs().to_string().len())
        .max()
        .unwrap_or(1)
        .max(4);
    let all_named = labels.iter().all(|l| given.contains_key(l));
    let distinct: HashSet<&String> = given.values().collect();
    let sorted_keeps_order = all_named
        && distinct.len() == labels.len()
        && labels
            .windows(2)
            .all(|w| given[&w[0]].as_bytes() < given[&w[1]].as_bytes());
    let dir_of = |l: i64| -> String {
        match given.get(&l) {
            Some(n) if sorted_keeps_order => n.clone(),
            Some(n) => format!("{l:0width$}_{n}"),
            None => format!("{l:0width$}"),
        }
    };
    samples
        .iter()
        .map(|s| match s.label {
            Some(l) => vec![dir_of(l)],
            None if labels.is_empty() => Vec::new(),
            None => vec!["unlabelled".to_string()],
        })
        .collect()
}

/// The image extension of `bytes` by magic number (`jpg`, `png`, `webp`, `gif`, `bmp`,
/// `tiff`), `bin` when unknown.
pub fn sniff_ext(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        "jpg"
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        "png"
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        "webp"
    } else if bytes.starts_with(b"GIF8") {
        "gif"
    } else if bytes.starts_with(b"BM") {
        "bmp"
    } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        "tiff"
    } else {
        "bin"
    }
}

/// One open handle per distinct file of `paths`.
pub(crate) fn open_files<'a>(
    paths: impl Iterator<Item = &'a Path>,
) -> std::io::Result<HashMap<PathBuf, std::sync::Arc<std::fs::File>>> {
    let mut out = HashMap::new();
    for p in paths {
        if !out.contains_key(p) {
            out.insert(
                p.to_path_buf(),
                std::sync::Arc::new(std::fs::File::open(p)?),
            );
        }
    }
    Ok(out)
}

/// Expands a brace pattern as WebDataset readers do (`braceexpand`): `{a..b}` numeric ranges
/// (zero-padded to the width of `a` when it starts with 0) and `{x,y}` alternatives, nested
/// left to right. `shard-{000000..000002}.tar` gives three names. At most 10^7 names.
pub fn expand_braces(pat: &str) -> Vec<String> {
    let Some(open) = pat.find('{') else {
        return vec![pat.to_string()];
    };
    let Some(close) = pat[open..].find('}').map(|i| open + i) else {
        return vec![pat.to_string()];
    };
    let (head, body, tail) = (&pat[..open], &pat[open + 1..close], &pat[close + 1..]);
    let mut alts: Vec<String> = Vec::new();
    if let Some((a, b)) = body.split_once("..") {
        if let (Ok(x), Ok(y)) = (a.parse::<u64>(), b.parse::<u64>()) {
            let width = if a.starts_with('0') { a.len() } else { 0 };
            if x <= y && y - x < 10_000_000 {
                alts = (x..=y).map(|n| format!("{n:0width$}")).collect();
            }
        }
    }
    if alts.is_empty() {
        alts = body.split(',').map(str::to_string).collect();
    }
    alts.iter()
        .flat_map(|a| expand_braces(&format!("{head}{a}{tail}")))
        .collect()
}

/// The files a source names: a brace pattern's expansion when `src` does not exist and has
/// braces. Errors: a file of the expansion is missing.
pub(crate) fn brace_files(src: &Path) -> Option<Result<Vec<PathBuf>>> {
    let s = src.to_str()?;
    if src.exists() || !s.contains('{') {
        return None;
    }
    let v: Vec<PathBuf> = expand_braces(s).into_iter().map(PathBuf::from).collect();
    Some(match v.iter().find(|p| !p.is_file()) {
        Some(p) => Err(anyhow::anyhow!(
            "{} (from the pattern {s}) is missing",
            p.display()
        )),
        None => Ok(v),
    })
}

/// The first `n` bytes of `path` at `off` (fewer at the end of the file).
pub(crate) fn read_at(path: &Path, off: u64, n: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let k = f.read_at(&mut buf[got..], off + got as u64)?;
        if k == 0 {
            break;
        }
        got += k;
    }
    buf.truncate(got);
    Ok(buf)
}

/// Modification time of `p` in seconds since the epoch (0 when unknown).
pub(crate) fn mtime_of(p: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.mtime()).unwrap_or(0)
}

/// The files of directory `dir` whose names `keep` accepts, sorted by name bytes.
pub(crate) fn list_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("cannot list {}: {e}", dir.display()))?
    {
        let e = e?;
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        if keep(n) && e.file_type()?.is_file() {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_like_braceexpand() {
        assert_eq!(
            expand_braces("s-{000008..000010}.tar"),
            ["s-000008.tar", "s-000009.tar", "s-000010.tar"]
        );
        assert_eq!(expand_braces("{a,b}/{1..2}"), ["a/1", "a/2", "b/1", "b/2"]);
        assert_eq!(expand_braces("plain.tar"), ["plain.tar"]);
    }

    #[test]
    fn format_names_and_aliases_parse() {
        for f in Format::ALL {
            assert_eq!(Format::parse(f.name()), Some(f));
        }
        assert_eq!(Format::parse("webdataset"), Some(Format::Tar));
        assert_eq!(Format::parse("wds"), Some(Format::Tar));
        assert_eq!(Format::parse("huggingface"), Some(Format::Parquet));
        assert_eq!(Format::parse("hf-parquet"), Some(Format::Parquet));
        assert_eq!(Format::parse("TAR"), None, "names are lower case");
        assert_eq!(Format::parse("hdf5"), None);
    }

    fn labelled(label: i64, class: Option<&str>) -> Sample {
        Sample {
            label: Some(label),
            class: class.map(str::to_string),
            ..Sample::default()
        }
    }

    #[test]
    fn class_directories_sort_in_label_order() {
        // Names that sort like the labels are used as they are.
        let s = [labelled(0, Some("n014")), labelled(1, Some("n015"))];
        assert_eq!(name_classes(&s, None), [vec!["n014"], vec!["n015"]]);
        // Names that would reorder the classes get the label in front.
        let s = [labelled(0, Some("dog")), labelled(1, Some("cat"))];
        assert_eq!(name_classes(&s, None), [vec!["0000_dog"], vec!["0001_cat"]]);
        // No names: zero-padded labels, as stored (1-based stays 1-based).
        let s = [labelled(1, None), labelled(12, None)];
        assert_eq!(name_classes(&s, None), [vec!["0001"], vec!["0012"]]);
        // --class-names: line i names the i-th smallest label.
        let names = ["b".to_string(), "a".to_string()];
        let s = [labelled(5, None), labelled(9, None)];
        assert_eq!(
            name_classes(&s, Some(&names)),
            [vec!["0005_b"], vec!["0009_a"]]
        );
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn long_names_are_cut_to_name_max_keeping_their_extension_and_uniqueness() {
        assert_eq!(safe_name("a/b"), "a_b");
        assert_eq!(safe_name(".."), "_..");
        let a = format!("{}.JPEG", "é".repeat(3000));
        let b = format!("{}x.JPEG", "é".repeat(3000));
        let (sa, sb) = (safe_name(&a), safe_name(&b));
        assert!(sa.len() <= NAME_MAX && sb.len() <= NAME_MAX, "{}", sa.len());
        assert!(sa.ends_with(".JPEG") && sb.ends_with(".JPEG"));
        assert_ne!(sa, sb);
        assert_eq!(safe_name(&a), sa, "deterministic");
        let c = "x".repeat(NAME_MAX);
        assert_eq!(safe_name(&c), c);
    }
}
