//! Loose objects under an S3 prefix (`s3://bucket/imagenet/train/`) or in a directory an HTTP
//! server lists (`https://host/train/`, [`crate::storage::object::http_listing`]), served as a read-only
//! tree of ordinary files: the prefix is listed (LISTs only: no object is fetched to mount),
//! each key below it becomes a file with the size and ETag its listing gave, and its parents
//! directories. The tree is laid out as a loose directory's is ([`super::dir`]): an index held
//! in memory whose records address the objects one after the other at page-aligned offsets,
//! so read-ahead, warm, pin, decoded views, drop-cache and stats are the pack's, unchanged.
//!
//! Every GET carries the ETag the listing gave (`If-Match`, and the answer's ETag is compared;
//! an HTTP listing gives none: its `Last-Modified` and size instead, [`Pin::modified`]):
//! an object replaced since the mount answers ESTALE for that file only, never bytes of two
//! versions. The objects, laid end to end at those offsets ([`EndToEnd`]), share one block
//! cache: one cache file and one block table for the whole prefix, not a directory of files per
//! object (single flight: each block fetched once however many readers want it; a block's
//! objects are fetched by one GET each, together). The cache is that of one listing: its
//! name is a digest of every kept key, size and ETag, so a prefix whose listing changed is
//! cached afresh (the old cache is pruned like any unused one).
//!
//! Keys a file system cannot show are left out, each logged with the reason: an empty, `.` or
//! `..` segment (`a//b`, `./x`), a key ending in `/` (a console's "folder" marker), a key that
//! is also a prefix of others (`x` and `x/y`: the directory is kept), names starting with `.`
//! (as a prefix's foreign-dataset listing skips them).

use super::caches::LockedCaches;
use crate::catalog::ObjectInfo;
use crate::catalog::native::NativeCatalog;
use crate::open::OpenOptions;
use crate::pack::index::{self, Node, Record};
use crate::storage::block_cache::{self as cache, BlockCache};
use crate::storage::object::end_to_end::{EndToEnd, Member};
use crate::storage::object::source::{Listed, ObjectSource, ObjectStore, Pin};
use crate::view::Views;
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod shared_listing;

/// The packed format a key's name says it is a shard of: by its extension, or TFRecord's
/// `NAME-00000-of-00008` naming (TensorFlow's shards carry no extension).
fn shard_kind(key: &str) -> Option<&'static str> {
    let k = key.to_ascii_lowercase();
    // The shards' endings are the format registry's (`crate::formats::Format::shard_extensions`).
    let mut known = crate::formats::Format::ALL
        .iter()
        .flat_map(|f| f.shard_extensions().iter().copied());
    if let Some(ext) = known.find(|e| k.ends_with(*e)) {
        return Some(ext);
    }
    let name = k.rsplit('/').next().unwrap_or(&k);
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let tf = name.rsplit_once("-of-").is_some_and(|(head, total)| {
        digits(total) && head.rsplit_once('-').is_some_and(|(_, n)| digits(n))
    });
    tf.then_some(".tfrecord")
}

/// Whether the listing `keys` (relative to the prefix) holds a packed format rather than
/// loose files: an `index.json` at the top (MDS, LitData), a GulpIO `.gmeta`, or every object
/// (names starting with `.` left out) a shard of one format. A mixed tree (a LeRobot dataset's
/// `meta/`, `data/*.parquet` and `videos/*.mp4`) is loose files.
pub fn holds_a_format(keys: &[String]) -> bool {
    let keys: Vec<&String> = (keys.iter())
        .filter(|k| !k.split('/').any(|c| c.starts_with('.')))
        .collect();
    if (keys.iter()).any(|k| k.as_str() == "index.json" || k.ends_with(".gmeta")) {
        return true;
    }
    let first = keys.first().and_then(|k| shard_kind(k));
    first.is_some() && keys.iter().all(|k| shard_kind(k) == first)
}

/// A directory of the tree being built: its subdirectories and files by name.
#[derive(Default)]
struct Dir {
    dirs: BTreeMap<Vec<u8>, Dir>,
    /// Per file: its object (index into the listing's kept objects).
    files: BTreeMap<Vec<u8>, usize>,
}

/// The largest size a listed object may have (1 PiB; S3 holds up to 5 TiB an object, Azure's
/// block blobs about 190 TiB): a larger one is left out, a listing's error, not an object.
const MAX_OBJECT: u64 = 1 << 50;

/// The most all listed objects may hold together (4 EiB): their layout, padded to blocks,
/// stays far inside a `u64`.
const MAX_TOTAL: u64 = 1 << 62;

/// Why a key is left out, if it is.
fn left_out(key: &str) -> Option<&'static str> {
    if key.ends_with('/') {
        Some("a key ending in '/' (a folder marker) is no file")
    } else if key
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        Some("an empty, '.' or '..' path segment has no place in a file system")
    } else if key.split('/').any(|c| c.starts_with('.')) {
        Some("names starting with '.' are left out")
    } else if key.contains('\0') {
        Some("a NUL in a name")
    } else {
        None
    }
}

/// The loose objects under an S3 prefix, listed and laid out as a tree.
#[derive(Debug)]
pub struct RemoteDir {
    url: String,
    root: PathBuf,
    /// Kept objects: name below the prefix, and pin.
    pub objects: Vec<(String, Pin)>,
    /// Keys left out, each with the reason.
    pub skipped: Vec<(String, &'static str)>,
    cache: Arc<BlockCache>,
    /// Bytes of the objects laid end to end, gaps included.
    len: u64,
    index: Arc<memmap2::Mmap>,
    /// The shared listing it was opened from ([`listing`]), if any (else from a listing).
    pub shared: Option<String>,
}

impl RemoteDir {
    /// Opens the loose objects `listed` (name below the prefix, pin) of the S3 prefix `url`:
    /// the tree built from the names, every object pinned to its listed ETag, one block cache
    /// for them all in the cache root. No object is fetched.
    ///
    /// Errors: nothing listed, an object listed without an ETag, the cache root or the block
    /// cache cannot be used (locked by another mount of the same listing, say).
    pub fn open(
        url: &str,
        listed: Vec<Listed>,
        args: &OpenOptions,
        store: &dyn ObjectStore,
    ) -> Result<RemoteDir> {
        let (kept, modified, mut skipped) = sort_out(url, listed)?;
        let (top, dropped) = tree_of(&kept);
        for (i, (key, _)) in kept.iter().enumerate() {
            if dropped[i] {
                skipped.push((
                    key.clone(),
                    "a key that is also a prefix of other keys: the directory is shown",
                ));
            }
        }
        for (key, why) in &skipped {
            log::warn!("{url}{key}: left out: {why}");
        }
        if dropped.iter().all(|&d| d) {
            bail!("{url}: no objects under this prefix that a file system can show");
        }
        let mut clients: Vec<Option<Arc<dyn ObjectSource>>> = Vec::with_capacity(kept.len());
        for (i, (name, pin)) in kept.iter().enumerate() {
            if dropped[i] {
                clients.push(None);
                continue;
            }
            let c = store.object(&crate::storage::object::url_below(url, name))?;
            c.set_pin(pin.clone());
            clients.push(Some(c));
        }
        let jpegs = if args.probe_jpegs {
            probe_jpegs(&kept, &clients, args.remote.max_requests)
        } else {
            vec![None; kept.len()]
        };
        let Layout {
            nodes,
            order,
            bases,
            len,
        } = lay_out(&top, &kept, &modified, &jpegs);
        let objects: Vec<(String, Pin)> = order.iter().map(|&i| kept[i].clone()).collect();
        let bytes_index =
            index::build(&nodes, 4096).with_context(|| format!("cannot index {url}"))?;
        let mut map = memmap2::MmapMut::map_anon(bytes_index.len())?;
        map.copy_from_slice(&bytes_index);
        let name = cache_name(&kept, &order, &bases);
        let members = (order.iter().zip(&bases))
            .map(|(&i, &base)| Member {
                source: clients[i].take().expect("a kept object has a client"),
                base,
            })
            .collect();
        let run = EndToEnd::new(url, members, len, name)?;
        let root = args
            .remote
            .cache_dir
            .clone()
            .unwrap_or_else(cache::default_root);
        let mut caches =
            LockedCaches::lock(&root, vec![Arc::new(run)])?.open(args.remote.cache_size)?;
        Ok(RemoteDir {
            url: url.to_string(),
            root,
            objects,
            skipped,
            cache: caches.remove(0),
            len,
            index: Arc::new(map.make_read_only()?),
            shared: None,
        })
    }

    /// The prefix's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cache root holding the objects' block caches.
    pub fn cache_root(&self) -> &Path {
        &self.root
    }

    /// Bytes of every object served.
    pub fn size(&self) -> u64 {
        self.objects.iter().map(|(_, p)| p.size).sum()
    }

    /// The catalog of the tree, showing `views` (their sizes come from each JPEG's header when
    /// it is first read). Errors: the index does not validate (a bug, reported as such).
    pub fn catalog(&self, views: Views) -> Result<NativeCatalog> {
        let run = ObjectInfo {
            path: PathBuf::from(&self.url),
            len: self.len,
            data_end: self.len,
            align: 4096,
        };
        let cat = NativeCatalog::with_objects(
            self.index.clone(),
            0..self.index.len(),
            vec![run],
            vec![0],
            views,
        )
        .map_err(|e| anyhow!("{}: {e}", self.url))?;
        // No CRC-32 to check: each object is pinned to its ETag instead.
        Ok(cat.without_checksums())
    }

    /// The tree's index. Errors: it does not validate (a bug, reported as such).
    pub fn view(&self) -> Result<crate::pack::index::IndexView<'_>> {
        crate::pack::index::IndexView::parse(&self.index[..])
            .map_err(|e| anyhow!("{}: {e}", self.url))
    }

    /// The storage: the objects' block cache.
    pub fn storage(&self) -> Arc<dyn crate::storage::Storage> {
        self.cache.clone()
    }

    /// Where its files are, for the views composed over its catalog (a frame view copies
    /// its videos out of the block cache).
    pub fn files(&self) -> super::Files {
        super::Files::Prefix {
            url: self.url.clone(),
            cache_root: self.cache_root().to_path_buf(),
            index: self.index.clone(),
        }
    }

    /// The index's totals (files, directories, bytes).
    pub fn totals(&self) -> crate::pack::index::Totals {
        crate::pack::index::IndexView::parse(&self.index[..])
            .map(|v| v.totals())
            .unwrap_or_default()
    }
}

/// Bytes of an object's head fetched for its JPEG header (a second GET of up to
/// [`HEAD_MAX`] when the frame header lies further in): 8 KiB holds the frame header of the
/// ImageNet JPEGs.
const HEAD: u64 = 8 << 10;
/// The most fetched of an object for its JPEG header, bytes.
const HEAD_MAX: u64 = 256 << 10;

/// Width, height and components of each kept object named as a JPEG (`.jpg`, `.jpeg`, any
/// case), from a ranged GET of its head (at most `max` GETs in flight, none cached); `None`
/// for other objects and for those whose head is no JPEG header or cannot be fetched (logged:
/// they show no decoded views).
fn probe_jpegs(
    kept: &[(String, Pin)],
    clients: &[Option<Arc<dyn ObjectSource>>],
    max: usize,
) -> Vec<Option<crate::pack::jpeg::JpegInfo>> {
    use futures::StreamExt;
    let is_jpeg = |k: &str| {
        let k = k.to_ascii_lowercase();
        k.ends_with(".jpg") || k.ends_with(".jpeg")
    };
    let Some(rt) = clients.iter().flatten().next().map(|c| c.runtime()) else {
        return vec![None; kept.len()];
    };
    let probe = |i: usize| {
        let c = clients[i].clone();
        let size = kept[i].1.size;
        async move {
            let c = c?;
            let head = c.get(0..size.min(HEAD)).await.ok()?;
            let info = crate::pack::jpeg::probe(&head);
            if info.is_some() || size <= HEAD || !head.starts_with(&[0xFF, 0xD8, 0xFF]) {
                return info;
            }
            let head = c.get(0..size.min(HEAD_MAX)).await.ok()?;
            crate::pack::jpeg::probe(&head)
        }
    };
    let wanted: Vec<usize> = (0..kept.len())
        .filter(|&i| clients[i].is_some() && is_jpeg(&kept[i].0))
        .collect();
    let found: Vec<Option<crate::pack::jpeg::JpegInfo>> = rt.block_on(
        futures::stream::iter(wanted.iter().map(|&i| probe(i)))
            .buffered(max.max(1))
            .collect(),
    );
    let mut out = vec![None; kept.len()];
    let mut missed = 0;
    for (&i, info) in wanted.iter().zip(found) {
        missed += usize::from(info.is_none());
        out[i] = info;
    }
    if missed > 0 {
        log::warn!(
            "{missed} object(s) named as JPEGs have no JPEG header loosefs can read: no decoded views of them"
        );
    }
    out
}

/// A directory's record (mode 0755, `mtime` seconds since the epoch).
/// The listing sorted out: the objects kept (name below the prefix, pin) with their mtimes,
/// and the keys left out with the reason (the shared listing itself is neither).
///
/// Errors: a kept object listed without an ETag.
#[allow(clippy::type_complexity)]
fn sort_out(
    url: &str,
    listed: Vec<Listed>,
) -> Result<(Vec<(String, Pin)>, Vec<i64>, Vec<(String, &'static str)>)> {
    let mut skipped = Vec::new();
    let mut total = 0u64;
    let mut kept: Vec<(String, Pin)> = Vec::with_capacity(listed.len());
    let mut modified = Vec::with_capacity(listed.len());
    for Listed {
        key,
        pin,
        modified: m,
    } in listed
    {
        if key.ends_with(crate::formats::index::shared::SUFFIX) {
            continue;
        }
        match (left_out(&key), pin) {
            (Some(why), _) => skipped.push((key, why)),
            (None, Some(p)) if p.size > MAX_OBJECT => skipped.push((
                key,
                "its listed size is larger than any object store holds (1 PiB)",
            )),
            (None, Some(p)) => {
                total = total.saturating_add(p.size);
                if total > MAX_TOTAL {
                    bail!(
                        "{url}: the listed sizes add up to more than 4 EiB: not a listing to trust"
                    );
                }
                kept.push((key, p));
                modified.push(m);
            }
            (None, None) => bail!("{url}{key}: the listing gave no ETag to pin it to"),
        }
    }
    Ok((kept, modified, skipped))
}

/// The tree of the `kept` objects' names, and per object whether it is dropped: a key that is
/// also a prefix of other keys is a directory (its object is left out).
fn tree_of(kept: &[(String, Pin)]) -> (Dir, Vec<bool>) {
    let mut top = Dir::default();
    let mut dropped = vec![false; kept.len()];
    for (i, (key, _)) in kept.iter().enumerate() {
        let parts: Vec<&[u8]> = key.split('/').map(str::as_bytes).collect();
        let (last, dirs) = parts.split_last().expect("a key has a name");
        let mut d = &mut top;
        for p in dirs {
            if let Some(f) = d.files.remove(*p) {
                dropped[f] = true;
            }
            d = d.dirs.entry(p.to_vec()).or_default();
        }
        if d.dirs.contains_key(*last) {
            dropped[i] = true;
        } else {
            d.files.insert(last.to_vec(), i);
        }
    }
    (top, dropped)
}

/// Where the objects of a tree go: its index's nodes, the objects in tree order (indexes into
/// the kept objects) with their offsets in the run laid end to end, and the run's length.
struct Layout {
    nodes: Vec<Node>,
    order: Vec<usize>,
    bases: Vec<u64>,
    len: u64,
}

/// The tree `top` of the `kept` objects laid out: depth first, names sorted by bytes at each
/// level, each object at the next page-aligned offset (an object that fits a block never
/// straddling two), each file with its listed size and mtime (and JPEG dimensions when
/// probed), each directory with the newest mtime of what it holds.
fn lay_out(
    top: &Dir,
    kept: &[(String, Pin)],
    modified: &[i64],
    jpegs: &[Option<crate::pack::jpeg::JpegInfo>],
) -> Layout {
    let mut nodes = vec![Node {
        parent: None,
        name: Vec::new(),
        record: dir_record(0),
    }];
    let mut order: Vec<usize> = Vec::with_capacity(kept.len());
    let mut bases: Vec<u64> = Vec::with_capacity(kept.len());
    let mut at = 0u64;
    walk(top, 0, &mut nodes, &mut |i, r: &mut Record| {
        let size = kept[i].1.size;
        r.size = size;
        r.mtime_sec = modified[i];
        if let Some(j) = &jpegs[i] {
            (r.width, r.height, r.components) = (j.width, j.height, j.components);
        }
        // An object that fits a block never straddles two, so it is fetched by one GET (the
        // gap costs cache space, not requests: on average half an object per block).
        let block = cache::BLOCK;
        if size <= block && size > 0 && at / block != (at + size - 1) / block {
            at = at.next_multiple_of(block);
        }
        r.data_off = at;
        bases.push(at);
        order.push(i);
        at = (at + size).next_multiple_of(4096);
    });
    // A directory's mtime is the newest of what it holds (the same at every mount).
    for k in (1..nodes.len()).rev() {
        let (t, p) = (nodes[k].record.mtime_sec, nodes[k].parent.unwrap_or(0));
        if nodes[k].record.is_dir || t > 0 {
            let pr = &mut nodes[p].record;
            pr.mtime_sec = if pr.mtime_sec == 0 {
                t
            } else {
                pr.mtime_sec.max(t)
            };
        }
    }
    Layout {
        nodes,
        order,
        bases,
        // At least one byte: a tree of empty files still has a (zero) run to cache.
        len: at.max(1),
    }
}

/// The block cache's name of one listing laid out: a digest (XXH3-128) of every object's key,
/// ETag, version, date (when pinned to one), offset and size, in tree order, as an ETag-like string.
fn cache_name(kept: &[(String, Pin)], order: &[usize], bases: &[u64]) -> String {
    let mut digest = xxhash_rust::xxh3::Xxh3::new();
    for (&i, &base) in order.iter().zip(bases) {
        let (name, pin) = &kept[i];
        for part in [name.as_bytes(), pin.etag.as_bytes(), b"\0"] {
            digest.update(part);
        }
        digest.update(pin.version.as_deref().unwrap_or("").as_bytes());
        if let Some(m) = pin.modified {
            digest.update(&m.to_le_bytes());
        }
        digest.update(&base.to_le_bytes());
        digest.update(&pin.size.to_le_bytes());
    }
    format!("\"{:032x}\"", digest.digest128())
}

fn dir_record(mtime: i64) -> Record {
    Record {
        is_dir: true,
        mode: 0o040_755,
        mtime_sec: mtime,
        ..Record::default()
    }
}

/// Appends the nodes of `d`'s children (parent node `at`) depth first, names sorted by bytes,
/// files and directories together; `file(i, record)` fills in object `i`'s record.
fn walk(d: &Dir, at: usize, nodes: &mut Vec<Node>, file: &mut dyn FnMut(usize, &mut Record)) {
    let mut names: Vec<(&Vec<u8>, Option<&Dir>, Option<usize>)> = Vec::new();
    names.extend(d.dirs.iter().map(|(n, sub)| (n, Some(sub), None)));
    names.extend(d.files.iter().map(|(n, &i)| (n, None, Some(i))));
    names.sort_by(|a, b| a.0.cmp(b.0));
    for (name, sub, obj) in names {
        let k = nodes.len();
        let record = match obj {
            Some(i) => {
                let mut r = Record {
                    mode: 0o100_644,
                    ..Record::default()
                };
                file(i, &mut r);
                r
            }
            None => dir_record(0),
        };
        nodes.push(Node {
            parent: Some(at),
            name: name.clone(),
            record,
        });
        if let Some(sub) = sub {
            walk(sub, k, nodes, file);
        }
    }
}
