//! The shared listing of a prefix of loose objects: `loosefs index s3://bucket/train/` lists
//! the prefix once and writes every key with its size, ETag, version and `LastModified` as
//! one object beside the data (`s3://bucket/train/.loosefs-index`, or `--out`), so every
//! other node mounts with two requests instead of one LIST per 1000 keys:
//! 1. one LIST of the prefix's first level (`delimiter=/`, its first page of 1000 entries),
//!    which finds the index and its ETag, and is the check that the index is current: the
//!    objects directly under the prefix (each with its ETag and size) and the names of its
//!    subdirectories must be those the index recorded (up to the page's last entry when the
//!    level is longer), else the mount is refused naming the first that differs;
//! 2. one GET of the index, pinned to the ETag the LIST gave.
//!
//! Below the first level the index is trusted as a snapshot: an object replaced or deleted
//! since answers ESTALE for its own file at its first read (every GET carries the recorded
//! ETag), and an object added since is not shown until `loosefs index` is run again. The tree,
//! the offsets and the block cache's name are derived from the listing alone, so a node that
//! mounts from the index and one that lists the prefix build the same tree and share a cache.
//!
//! Layout: `LOOSEFSL` | u32 version (1) | u32 0 | zstd of the JSON [`Listing`]. A foreign
//! dataset's shared index (`LOOSEFSX`, [`crate::formats::index::shared`]) sits at the same
//! name; [`find`] leaves it to that opener.

use crate::formats::index::shared::SUFFIX;
use crate::open::OpenOptions;
use crate::storage::object::source::{Level, Listed, ObjectStore, Pin};
use crate::storage::object::{error_kind, is_url};
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;

const MAGIC: &[u8; 8] = b"LOOSEFSL";
const VERSION: u32 = 1;
/// Most bytes of JSON a shared listing may hold per compressed byte.
const MAX_RATIO: u64 = 100;

/// One object as the shared listing records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct ListedObject {
    /// Key relative to the prefix.
    key: String,
    /// Bytes.
    size: u64,
    /// The ETag as the server sent it (quotes included).
    etag: String,
    /// The object version (versioned buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    /// `LastModified`, seconds since the Unix epoch.
    modified: i64,
}

/// The shared listing's body.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Listing {
    /// The prefix it lists, as it was given to `loosefs index`.
    prefix: String,
    /// Every object under the prefix but the index itself, sorted by key.
    objects: Vec<ListedObject>,
}

/// The listing `listed` of `url` as a shared listing file's bytes.
///
/// Errors: an object listed without an ETag (it could not be pinned).
pub fn encode(url: &str, listed: &[Listed]) -> Result<Vec<u8>> {
    let objects = (listed.iter())
        .filter(|l| l.key != SUFFIX)
        .map(|l| {
            let p = (l.pin.as_ref())
                .ok_or_else(|| anyhow!("{url}{}: the listing gave no ETag to pin it to", l.key))?;
            Ok(ListedObject {
                key: l.key.clone(),
                size: p.size,
                etag: p.etag.clone(),
                version: p.version.clone(),
                modified: l.modified,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let json = serde_json::to_vec(&Listing {
        prefix: url.to_string(),
        objects,
    })?;
    let mut out = Vec::with_capacity(json.len() / 4 + 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&zstd::bulk::compress(&json, 3)?);
    Ok(out)
}

/// The objects a shared listing file's `bytes` (read from `at`) records, sorted by key.
/// `Ok(None)`: a loosefs index of another kind (a foreign dataset's shared index).
///
/// Errors: not a loosefs index, another version, damaged (naming `at`).
pub fn decode(bytes: &[u8], at: &str) -> Result<Option<Vec<Listed>>> {
    if bytes.starts_with(b"LOOSEFSX") {
        return Ok(None);
    }
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        bail!("{at} is not a loosefs index (no LOOSEFSL or LOOSEFSX magic)");
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        bail!("{at}: a shared listing of version {version}; this loosefs reads version {VERSION}");
    }
    // A listing's JSON compresses about 7× (100,000 keys: 2.3 MB): a body claiming far more
    // is refused before it is held in memory.
    let most = (bytes.len() as u64 - 16) * MAX_RATIO + (1 << 20);
    let mut json = Vec::new();
    let decoder = zstd::stream::read::Decoder::new(&bytes[16..])
        .with_context(|| format!("{at}: damaged (cannot decompress)"))?;
    std::io::Read::read_to_end(&mut std::io::Read::take(decoder, most + 1), &mut json)
        .with_context(|| format!("{at}: damaged (cannot decompress)"))?;
    if json.len() as u64 > most {
        bail!("{at}: damaged (decompresses to more than {MAX_RATIO}× its size)");
    }
    let l: Listing =
        serde_json::from_slice(&json).with_context(|| format!("{at}: damaged (bad JSON)"))?;
    let mut v: Vec<Listed> = (l.objects.into_iter())
        .map(|e| Listed {
            key: e.key,
            pin: Some(Pin {
                size: e.size,
                // No ETag (an HTTP server's listing): pinned to the date instead.
                modified: e.etag.is_empty().then_some(e.modified),
                etag: e.etag,
                version: e.version,
            }),
            modified: e.modified,
        })
        .collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Some(v))
}

/// A shared listing that no longer matches its prefix: object or directory `name` (relative to
/// `url`) `why` ("is gone", "changed", "was added") since `loosefs index` wrote it to `at`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the shared index {at} is stale: {url}{name} {why} since it was indexed; run `loosefs index {url}` again, or mount with --refresh"
)]
pub struct Stale {
    /// Where the shared listing was read.
    pub at: String,
    /// The prefix it lists.
    pub url: String,
    /// The first object or directory (`d/`) found to differ.
    pub name: String,
    /// How it differs.
    pub why: &'static str,
}

/// The recorded objects `listed` against the first level of the prefix now: the same objects
/// directly under it (each with its ETag and size) and the same subdirectories. Errors (stale)
/// name the first that differs.
pub fn check_level(
    level: &Level,
    listed: &[Listed],
    at: &str,
    url: &str,
) -> std::result::Result<(), Stale> {
    let stale = |name: &str, why: &'static str| Stale {
        at: at.to_string(),
        url: url.to_string(),
        name: name.to_string(),
        why,
    };
    // A first level longer than a page was listed up to its first page's last entry (in key
    // order: a directory `d` as `d/`): what the index records beyond it is not checked.
    let bound: Option<String> = level.more.as_ref().and_then(|_| {
        let objects = level.objects.iter().map(|l| l.key.clone());
        objects
            .chain(level.dirs.iter().map(|d| format!("{d}/")))
            .max()
    });
    let within = |k: &str| bound.as_deref().is_none_or(|b| k <= b);
    let top: Vec<&Listed> = (listed.iter())
        .filter(|l| !l.key.contains('/') && l.key != SUFFIX && within(&l.key))
        .collect();
    let now: Vec<&Listed> = (level.objects.iter()).filter(|l| l.key != SUFFIX).collect();
    for r in &top {
        match now.iter().find(|l| l.key == r.key) {
            None => return Err(stale(&r.key, "is gone")),
            Some(l) => {
                let same = |p: &Pin, q: &Pin| {
                    p.etag == q.etag && p.size == q.size && p.modified == q.modified
                };
                if !(l.pin.as_ref()).is_some_and(|p| r.pin.as_ref().is_some_and(|q| same(p, q))) {
                    return Err(stale(&r.key, "changed"));
                }
            }
        }
    }
    if let Some(l) = now.iter().find(|l| !top.iter().any(|r| r.key == l.key)) {
        return Err(stale(&l.key, "was added"));
    }
    let mut dirs: Vec<&str> = (listed.iter())
        .filter_map(|l| l.key.split_once('/').map(|(d, _)| d))
        .filter(|d| within(&format!("{d}/")))
        .collect();
    dirs.dedup();
    for d in &dirs {
        if !level.dirs.iter().any(|x| x == d) {
            return Err(stale(&format!("{d}/"), "is gone"));
        }
    }
    if let Some(d) = level.dirs.iter().find(|x| !dirs.contains(&x.as_str())) {
        return Err(stale(&format!("{d}/"), "was added"));
    }
    Ok(())
}

/// The shared listing of the prefix `url` (of a bucket store: `bucket`, else an HTTP
/// directory) for a mount: `--index` when given, else `<url>.loosefs-index`, checked against
/// `level` (the prefix's first level, just listed; `None`: an HTTP directory the server does
/// not list, so nothing to check against). In a bucket the index is fetched only when `level` holds it, pinned to the ETag that listing gave;
/// from an HTTP server (whose listings hide names starting with `.`) it is asked for by name.
/// Returns what was found ([`Found`]).
///
/// Errors: a named index missing; a fetch that fails; not a loosefs index or damaged.
pub fn find(
    url: &str,
    bucket: bool,
    level: Option<&Level>,
    args: &OpenOptions,
    store: &dyn ObjectStore,
) -> Result<Found> {
    let (at, named) = match &args.shared_index {
        Some(p) => (p.to_string_lossy().into_owned(), true),
        None => (format!("{url}{SUFFIX}"), false),
    };
    // A first level of shards of one packed format (or its `index.json`) is no loose tree:
    // its shared index is a foreign dataset's, fetched by that opener.
    if let Some(level) = level.filter(|_| !named) {
        let keys: Vec<String> = level.objects.iter().map(|l| l.key.clone()).collect();
        if level.dirs.is_empty() && super::holds_a_format(&keys) {
            return Ok(Found::None);
        }
    }
    let bytes = if is_url(&at) {
        let client = store.object(&at)?;
        if !named {
            match level.and_then(|l| l.objects.iter().find(|l| l.key == SUFFIX)) {
                Some(Listed { pin: Some(p), .. }) if !p.etag.is_empty() => {
                    client.set_pin(p.clone())
                }
                Some(_) => {}
                None if bucket => return Ok(Found::None),
                None => {}
            }
        }
        let tmp = crate::formats::index::temp_file(args.index_dir.as_deref())?;
        match client.fetch_to(tmp.path()) {
            Err(e) if !named && !bucket && error_kind(&e) == Some(std::io::ErrorKind::NotFound) => {
                return Ok(Found::None);
            }
            r => r.with_context(|| format!("cannot read the shared index {at}"))?,
        };
        std::fs::read(tmp.path())
    } else {
        std::fs::read(&at)
    }
    .with_context(|| format!("cannot read the shared index {at}"))?;
    let Some(listed) = decode(&bytes, &at)? else {
        return Ok(Found::None);
    };
    match level {
        Some(level) => {
            if let Err(stale) = check_level(level, &listed, &at, url) {
                return Ok(Found::Stale(stale));
            }
        }
        None => log::info!(
            "{at}: {url} is not listed by its server, so the shared index is taken as it is (an object changed since answers ESTALE)"
        ),
    }
    Ok(Found::Fresh(listed, at))
}

/// What [`find`] found for a mount.
#[derive(Debug)]
pub enum Found {
    /// No shared listing there, or a foreign dataset's shared index (left to its opener).
    None,
    /// A shared listing that matches the prefix's first level: its objects, and where it was
    /// read.
    Fresh(Vec<Listed>, String),
    /// A shared listing that no longer matches the prefix's first level.
    Stale(Stale),
}

/// `loosefs index s3://bucket/prefix/` of loose objects: the full listing `listed` written as
/// a shared listing to `out` (an `s3://` URL or a local path), by default
/// `<url>.loosefs-index`. Returns the line to print.
///
/// Errors: an object without an ETag; `out` is an `https://` URL; the upload is refused; a
/// local file that cannot be written.
pub fn write(
    url: &str,
    listed: &[Listed],
    out: Option<&Path>,
    store: &dyn ObjectStore,
) -> Result<String> {
    let dest = match out {
        Some(p) => p.to_string_lossy().into_owned(),
        None => format!("{url}{SUFFIX}"),
    };
    let bytes = encode(url, listed)?;
    let (n, size) = (listed.iter())
        .filter(|l| l.key != SUFFIX)
        .fold((0u64, 0u64), |(n, s), l| {
            (n + 1, s + l.pin.as_ref().map_or(0, |p| p.size))
        });
    let dir = match is_url(&dest) {
        true if !crate::storage::object::is_bucket_url(&dest) => bail!(
            "{dest}: an index is written to a bucket ({}) or a local path (over HTTP: `--out FILE`, then publish FILE as {url}{SUFFIX})",
            crate::storage::object::bucket_forms()
        ),
        true => std::env::temp_dir(),
        false => (Path::new(&dest).parent())
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf(),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, &bytes)
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    if is_url(&dest) {
        store
            .upload(&dest, tmp.path())
            .with_context(|| format!("cannot upload the index to {dest}"))?;
    } else {
        // Every node (and user) that mounts the prefix reads it.
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )?;
        tmp.persist(&dest)
            .with_context(|| format!("cannot write {dest}"))?;
    }
    Ok(format!(
        "{dest}: shared listing of {url} ({n} objects, {size} bytes, {} bytes written); mounts of it make 2 requests (a LIST of the first level, a GET of this index) while the first level is unchanged",
        bytes.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(key: &str, etag: &str, size: u64) -> Listed {
        Listed {
            key: key.into(),
            pin: Some(Pin {
                size,
                etag: etag.into(),
                version: None,
                modified: None,
            }),
            modified: 1_700_000_000,
        }
    }

    #[test]
    fn a_listing_round_trips_and_a_foreign_index_is_left_alone() {
        let listed = vec![l("a/x.jpg", "\"1\"", 10), l("b.txt", "\"2\"", 3)];
        let bytes = encode("s3://b/p/", &listed).unwrap();
        assert_eq!(decode(&bytes, "I").unwrap().unwrap(), listed);
        assert!(
            decode(b"LOOSEFSX\x02\0\0\0\0\0\0\0", "I")
                .unwrap()
                .is_none()
        );
        let e = decode(b"hello world, not an index", "I").unwrap_err();
        assert!(e.to_string().contains("not a loosefs index"), "{e}");
        let mut bad = bytes.clone();
        bad.truncate(20);
        let e = decode(&bad, "I").unwrap_err();
        assert!(format!("{e:#}").contains("damaged"), "{e:#}");
        let e = encode(
            "s3://b/p/",
            &[Listed {
                pin: None,
                ..l("z", "", 0)
            }],
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("s3://b/p/z: the listing gave no ETag"),
            "{e}"
        );
    }

    #[test]
    fn a_first_level_that_differs_from_the_index_names_what_changed() {
        let rec = vec![
            l("a/x.jpg", "\"1\"", 10),
            l("a/y.jpg", "\"2\"", 10),
            l("b/z.jpg", "\"3\"", 10),
            l("top.json", "\"4\"", 5),
        ];
        let level = |objects: Vec<Listed>, dirs: &[&str]| Level {
            objects,
            dirs: dirs.iter().map(|d| d.to_string()).collect(),
            more: None,
        };
        let idx = l(SUFFIX, "\"i\"", 99);
        let now = level(vec![idx.clone(), l("top.json", "\"4\"", 5)], &["a", "b"]);
        check_level(&now, &rec, "I", "s3://b/p/").unwrap();
        let err = |lv: &Level| {
            check_level(lv, &rec, "I", "s3://b/p/")
                .unwrap_err()
                .to_string()
        };
        let e = err(&level(vec![l("top.json", "\"5\"", 5)], &["a", "b"]));
        assert!(e.contains("is stale: s3://b/p/top.json changed"), "{e}");
        let e = err(&level(vec![], &["a", "b"]));
        assert!(e.contains("top.json is gone"), "{e}");
        let e = err(&level(
            vec![l("top.json", "\"4\"", 5), l("new", "\"9\"", 1)],
            &["a", "b"],
        ));
        assert!(e.contains("s3://b/p/new was added"), "{e}");
        let e = err(&level(vec![l("top.json", "\"4\"", 5)], &["a"]));
        assert!(e.contains("s3://b/p/b/ is gone"), "{e}");
        let e = err(&level(vec![l("top.json", "\"4\"", 5)], &["a", "b", "c"]));
        assert!(e.contains("s3://b/p/c/ was added"), "{e}");
        assert!(e.contains("run `loosefs index s3://b/p/` again"), "{e}");
        // Only a first page listed (through `a/`): `b/` and `top.json` lie beyond it.
        let page = Level {
            more: Some("token".into()),
            ..level(vec![idx], &["a"])
        };
        check_level(&page, &rec, "I", "s3://b/p/").unwrap();
        let page = Level {
            more: Some("token".into()),
            ..level(vec![], &["a", "aa"])
        };
        let e = err(&page);
        assert!(e.contains("s3://b/p/aa/ was added"), "{e}");
    }
}
