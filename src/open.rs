//! Where every source is opened, one file per kind, behind one dispatch ([`Dataset::open`]):
//!
//! | source | file |
//! |---|---|
//! | a native pack (a local file) | `open/pack.rs` |
//! | a dataset in another packed format (local) | `open/foreign.rs` (scanned by [`crate::formats`]) |
//! | a plain directory, served in place | `open/dir.rs` |
//! | a native pack at a URL | `open/remote_pack.rs` |
//! | a foreign dataset at a URL (prefix, brace pattern, `index.json`) | `open/remote_dataset.rs`, `open/remote_dataset/` |
//! | loose objects under a prefix, or a directory an HTTP server lists | `open/remote_dir.rs`, `open/remote_dir/` |
//!
//! A URL is understood once (`open/url.rs`: its store and shape); what it holds is found once
//! by one documented sequence of probes (`open/discover.rs`), whose answer a mount opens and
//! `loosefs index URL` indexes (`open/remote.rs`, [`index_url`]).
//!
//! Remote openers reach objects through an [`ObjectStore`] (the network's, from
//! [`crate::storage::object::connect`], or the tests' in-memory store) and share one rule for
//! their block caches' budget (`open/caches.rs`). Every kind ends as the same [`Opened`]
//! value (catalog, storage, owner, lease, and where its files are): what the source *is*.
//! What is served over it (frames, a directory's live changes, the filesystem) is composed
//! once for every kind by `crate::mount::compose`; opening serves nothing and starts no
//! thread pool.
//! Options come as the plain [`OpenOptions`]: the command line's types stay in
//! [`crate::options`].

use crate::catalog::Catalog;
use crate::formats::index::Foreign;
use crate::formats::{Format, ScanOptions};
use crate::pack::reader::Pack;
use crate::storage::Storage;
use crate::storage::object::remote_config::RemoteConfig;
use crate::storage::object::source::ObjectStore;
use crate::view::Views;
use anyhow::{Context, Result};
use dir::LooseDir;
use remote_dataset::RemoteDataset;
use remote_dir::RemoteDir;
use remote_pack::RemotePack;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod caches;
pub mod dir;
pub(crate) mod discover;
pub mod foreign;
pub mod pack;
mod remote;
pub mod remote_dataset;
pub mod remote_dir;
pub mod remote_pack;
pub(crate) mod url;
pub use discover::{NotRecognised, Tried};
pub use remote::index_url;

/// Why a source could not be opened, where the kind decides what the caller does next.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file or object has no loosefs pack trailer: another format may read it.
    #[error("{src}: not a loosefs pack ({why})")]
    NotAPack {
        /// The file or URL.
        src: String,
        /// What was missing or wrong.
        why: String,
    },
    /// Any other failure, with its message (the file or URL named in it).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> OpenError {
        OpenError::Other(e.into())
    }
}

/// How a source is opened: the plain form of the command line's source options
/// (`crate::options::SourceArgs` converts into it once).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Read the source as this format instead of detecting it.
    pub format: Option<Format>,
    /// A file of class directory names, one per line (line i names the i-th smallest label).
    pub class_names: Option<PathBuf>,
    /// The field holding the label, instead of the format's usual one.
    pub label: Option<String>,
    /// Every field of a sample is a file (`--fields all`), not only the image.
    pub fields_all: bool,
    /// Every sample read and checked once at indexing (`--verify full`), not lazily.
    pub verify_full: bool,
    /// A shared index written by `loosefs index` (default: beside the dataset when there).
    pub shared_index: Option<PathBuf>,
    /// A stale shared listing of loose objects is replaced (the prefix listed again), not
    /// refused (`--refresh`).
    pub refresh_index: bool,
    /// Where kept indexes live (default: `index/` under [`crate::storage::cache_root`]).
    pub index_dir: Option<PathBuf>,
    /// Memory for decompressed chunks of a compressed source, bytes.
    pub chunk_cache: u64,
    /// How URLs are reached and cached.
    pub remote: RemoteConfig,
    /// Read every JPEG header of a loose directory when it is opened (decoded views need the
    /// dimensions).
    pub probe_jpegs: bool,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            format: None,
            class_names: None,
            label: None,
            fields_all: false,
            verify_full: false,
            shared_index: None,
            refresh_index: false,
            index_dir: None,
            chunk_cache: 1 << 30,
            remote: RemoteConfig::default(),
            probe_jpegs: false,
        }
    }
}

impl OpenOptions {
    /// These options as `loosefs info SRC` uses them: a local source shows its JPEGs'
    /// dimensions (every JPEG header read); a URL is opened as a mount opens it (a zip or FFCV
    /// object from its tables alone, not downloaded for its JPEG headers).
    pub fn for_info(&self, src: &Path) -> OpenOptions {
        let url = src.to_str().is_some_and(crate::storage::object::is_url);
        OpenOptions {
            probe_jpegs: !url || self.probe_jpegs,
            ..self.clone()
        }
    }

    /// The scan options these give. Errors: the class-names file cannot be read.
    pub fn scan_options(&self) -> Result<ScanOptions> {
        let class_names = match &self.class_names {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read class names {}", p.display()))?
                    .lines()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect(),
            ),
            None => None,
        };
        Ok(ScanOptions {
            format: self.format,
            class_names,
            label: self.label.clone(),
            fields_all: self.fields_all,
            inflate_dir: crate::formats::index::cache_dir(self.index_dir.as_deref()),
            shared_index: match &self.shared_index {
                Some(p) => crate::formats::SharedIndex::At(p.clone()),
                None => crate::formats::SharedIndex::Auto,
            },
            verify: match self.verify_full {
                true => crate::formats::Verify::Full,
                false => crate::formats::Verify::Lazy,
            },
            views: self.probe_jpegs,
            tables_only: false,
        })
    }
}

/// An opened source.
#[derive(Debug)]
pub enum Dataset {
    /// A native pack.
    Pack(Pack),
    /// Another format, through its index.
    Foreign(Foreign),
    /// A native pack at a URL (any store: S3, GCS, Azure, HTTPS), through its block cache.
    Remote(RemotePack),
    /// A loose dataset directory, served in place.
    Dir(LooseDir),
    /// A foreign dataset at a URL (any store), one block cache per object.
    RemoteSet(Box<RemoteDataset>),
    /// Loose objects under a prefix of a bucket or container, or in a directory an HTTP server
    /// lists, served as files.
    RemoteDir(Box<RemoteDir>),
}

/// What an opened source is, whatever the kind: what the served filesystem is composed of
/// (`crate::mount::compose`), nothing served yet.
pub struct Opened {
    /// What files exist and where their bytes are, showing the views asked for.
    pub catalog: Arc<dyn Catalog>,
    /// The bytes.
    pub storage: Arc<dyn Storage>,
    /// The source's metadata (a remote source's: its cache directory's): the mount shows
    /// its files as owned by its owner.
    pub owner: std::fs::Metadata,
    /// A native pack's file, leased while mounted (a writer opening it is noticed).
    pub lease: Option<std::fs::File>,
    /// Where its files are, for what is composed over the catalog (frames, live changes).
    pub files: Files,
}

/// Where an opened source's files are, beyond its catalog and storage: what a frame view
/// decodes from and what a directory's live changes are answered against.
pub enum Files {
    /// Packed (a native pack, a packed format, local or remote): the catalog is all.
    Packed,
    /// A local directory, served in place.
    Dir {
        /// Its root.
        root: PathBuf,
        /// Its catalog without views: what the walk found, to which names changed while
        /// mounted are compared.
        raw: Arc<dyn Catalog>,
        /// Its files, as one storage object.
        files: Arc<crate::storage::files::FileSet>,
    },
    /// Loose objects under a prefix, through one block cache (the storage).
    Prefix {
        /// The prefix's URL.
        url: String,
        /// The cache root (a frame view's copies go beside the block cache).
        cache_root: PathBuf,
        /// The tree's index (a native index, [`crate::pack::index`]).
        index: Arc<memmap2::Mmap>,
    },
}

/// What `loosefs info` prints of a source ([`Dataset::info`]).
#[derive(Debug)]
pub struct Described {
    /// The summary, as `--json` prints it (pretty JSON, fields in their declared order).
    pub json: String,
    /// The summary and how the source is served, as text lines.
    pub text: String,
}

/// The metadata of `path` (the owner a mount shows). Errors: it cannot be read (names it).
fn metadata(path: &Path) -> Result<std::fs::Metadata> {
    std::fs::metadata(path)
        .with_context(|| format!("cannot read the metadata of {}", path.display()))
}

impl Dataset {
    /// Opens `src`: a URL through the network ([`Dataset::open_on`] with the store of
    /// [`crate::storage::object::connect`]); else a native pack unless `--format` names another
    /// format or `src` is a directory or not a pack; then the format is detected and the kept
    /// index loaded or built (`progress`: say so on stderr).
    ///
    /// Errors: a damaged native pack (its own message); a source in no known format (the
    /// message lists what was tried); a damaged foreign source (names the file).
    pub fn open(
        src: &Path,
        opts: &OpenOptions,
        progress: crate::progress::Progress,
    ) -> Result<Dataset> {
        let store = crate::storage::object::connect(opts.remote.clone());
        Dataset::open_on(src, opts, progress, store)
    }

    /// [`Dataset::open`] with URLs reached through `store`.
    pub fn open_on(
        src: &Path,
        opts: &OpenOptions,
        progress: crate::progress::Progress,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Dataset> {
        if let Some(url) = src.to_str().and_then(url::SourceUrl::parse) {
            return remote::open(&url, opts, progress, store);
        }
        let scan = opts.scan_options()?;
        if scan.format.is_none() && src.is_file() {
            return pack::open(src, opts, &scan, progress);
        }
        if scan.format.is_none() && src.is_dir() && !crate::source::foreign_dir(src) {
            return LooseDir::open(src, opts.probe_jpegs, progress).map(Dataset::Dir);
        }
        crate::formats::index::open(src, &scan, opts.index_dir.as_deref(), progress)
            .map(Dataset::Foreign)
    }

    /// The source's path (a foreign source's canonical path).
    pub fn path(&self) -> &Path {
        match self {
            Dataset::Pack(p) => p.path(),
            Dataset::Foreign(f) => &f.header.source,
            Dataset::Remote(r) => Path::new(r.url()),
            Dataset::Dir(d) => &d.root,
            Dataset::RemoteSet(r) => Path::new(r.url()),
            Dataset::RemoteDir(r) => Path::new(r.url()),
        }
    }

    /// Bytes of every file the samples are read from.
    pub fn stored_bytes(&self) -> u64 {
        match self {
            Dataset::Pack(p) => p.file_len(),
            Dataset::Foreign(f) => f.header.objects.iter().map(|o| o.len).sum(),
            Dataset::Remote(r) => r.size(),
            Dataset::Dir(d) => d.bytes(),
            Dataset::RemoteSet(r) => r.size(),
            Dataset::RemoteDir(r) => r.size(),
        }
    }

    /// What kind of source this is, in words for messages (`a loosefs pack`, ...).
    pub fn kind(&self) -> String {
        match self {
            Dataset::Pack(_) => "a loosefs pack".into(),
            Dataset::Foreign(f) => format!("a dataset packed as {}", f.header.format.name()),
            Dataset::Remote(_) => "a remote loosefs pack".into(),
            Dataset::Dir(_) => "a loose directory".into(),
            Dataset::RemoteSet(r) => format!(
                "a remote dataset packed as {}",
                r.foreign.header.format.name()
            ),
            Dataset::RemoteDir(_) => "a prefix of loose objects".into(),
        }
    }

    /// Whether the mount serves the source's own files in place, with their owners (a loose
    /// directory): `--allow-other` then checks that one user owns them all. One arm per kind.
    pub fn serves_files_in_place(&self) -> bool {
        match self {
            Dataset::Dir(_) => true,
            Dataset::Pack(_)
            | Dataset::Foreign(_)
            | Dataset::Remote(_)
            | Dataset::RemoteSet(_)
            | Dataset::RemoteDir(_) => false,
        }
    }

    /// What `loosefs info` says of this source: its summary as JSON (`verify::Info`, or
    /// `ForeignInfo` for a packed format) and as text, with lines on how it is served (in
    /// place, the requests it took to open, its cache, what was left out). One arm per kind:
    /// a new kind does not compile until it says what `info` shows.
    ///
    /// Errors: the summary cannot be written as JSON.
    pub fn info(self) -> Result<Described> {
        fn of<T: serde::Serialize>(v: &T, text: String) -> Result<Described> {
            Ok(Described {
                json: serde_json::to_string_pretty(v)?,
                text,
            })
        }
        match self {
            Dataset::Pack(p) => {
                let i = crate::verify::info(&p);
                of(&i, i.text())
            }
            Dataset::Foreign(f) => {
                let i = f.info();
                of(&i, i.text())
            }
            Dataset::Remote(mut r) => {
                r.finish();
                let i = crate::verify::info_of(r.url(), r.size(), r.totals());
                let text = format!(
                    "{}requests:      {} GET(s) to open\ncache:         {}\n",
                    i.text(),
                    r.open_requests,
                    r.cache_dir().display()
                );
                of(&i, text)
            }
            Dataset::Dir(d) => {
                let i =
                    crate::verify::info_of(&d.root.display().to_string(), d.bytes(), d.totals());
                let mut text = i.text();
                text += "served:        in place (a loose directory; nothing packed)\n";
                for (p, why) in &d.skipped {
                    text += &format!("left out:      {}: {why}\n", p.display());
                }
                of(&i, text)
            }
            Dataset::RemoteSet(r) => {
                let i = r.info();
                of(&i, format!("{}{}", i.text(), r.open_text()))
            }
            Dataset::RemoteDir(r) => {
                let i = crate::verify::info_of(r.url(), r.size(), r.totals());
                let mut text = i.text();
                text += "served:        loose objects, each a file (nothing packed)\n";
                text += &match &r.shared {
                    Some(at) => format!(
                        "requests:      a LIST of the first level and a GET of the shared index {at}\n"
                    ),
                    None => "requests:      LISTs only (no GET) to open\n".to_string(),
                };
                text += &format!("cache:         {}\n", r.cache_root().display());
                for (k, why) in &r.skipped {
                    text += &format!("left out:      {k}: {why}\n");
                }
                of(&i, text)
            }
        }
    }

    /// The views this source shows when `asked` for them: decided here, once, for every kind
    /// (every arm names its kinds: a new kind does not compile until it says). JPEG views
    /// (`npy`, `ppm`, `--decoded-only`) are served by every kind; frames by the kinds whose
    /// files can be videos in a tree (a directory, a prefix of loose objects).
    ///
    /// Errors: `--decode frames` of a pack or a packed format, naming the view and the source.
    pub fn views(&self, asked: Views) -> Result<Views> {
        match self {
            Dataset::Dir(_) | Dataset::RemoteDir(_) => Ok(asked),
            Dataset::Pack(_) | Dataset::Foreign(_) | Dataset::Remote(_) | Dataset::RemoteSet(_) => {
                if asked.frames {
                    return Err(crate::exit_code::refuse(
                        crate::exit_code::ExitKind::Usage,
                        format!(
                            "--decode frames: {} is {}, whose samples are no videos to decode; \
                             frames are served from a LeRobot v3 dataset or video files, in a \
                             directory or under a prefix of loose objects (a URL ending in `/`)",
                            self.path().display(),
                            self.kind()
                        ),
                    ));
                }
                Ok(asked)
            }
        }
    }

    /// What this source is, for serving it with decoded `views` (as [`Dataset::views`]
    /// decided them; frames are composed over it, not here); compressed chunks kept
    /// decompressed within `chunk_cache` bytes.
    ///
    /// Errors: a file cannot be opened, mapped or read for its metadata; the index does not
    /// fit the storage.
    pub fn opened(self, views: Views, chunk_cache: u64) -> Result<Opened> {
        match self {
            Dataset::Pack(p) => pack::opened(p, views),
            Dataset::Foreign(f) => foreign::opened(&f, views, chunk_cache),
            Dataset::Dir(d) => d.opened(views),
            Dataset::Remote(r) => Ok(Opened {
                catalog: Arc::new(r.catalog(views)?),
                storage: r.storage().clone(),
                owner: metadata(r.cache_dir())?,
                lease: None,
                files: Files::Packed,
            }),
            Dataset::RemoteSet(r) => Ok(Opened {
                catalog: Arc::new(r.catalog(views)?),
                storage: r.storage(chunk_cache),
                owner: metadata(r.cache_root())?,
                lease: None,
                files: Files::Packed,
            }),
            Dataset::RemoteDir(r) => Ok(Opened {
                catalog: Arc::new(r.catalog(views)?),
                storage: r.storage(),
                owner: metadata(r.cache_root())?,
                lease: None,
                files: r.files(),
            }),
        }
    }
}
