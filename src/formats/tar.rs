//! WebDataset shards and plain tar archives (uncompressed), read with the `tar` crate (ustar,
//! PAX and GNU long names; `formats.md` §4). A source is one `.tar` file, a directory of them
//! (shards in name order), or a brace pattern as WebDataset loaders take
//! (`shards/train-{000000..000146}.tar`).
//!
//! WebDataset grouping (`webdataset/tariterators.py`): a sample is a run of consecutive
//! regular members sharing a key, the key being the member path up to the first dot of its
//! base name; names like `__x__` are skipped. When some sample has a label member (`.cls`,
//! `.cls2`, `.class`, `.label`: ASCII integer), the mount shows one image per sample under
//! its class (`.txt` gives the class name when it is one short word); a tar without labels is
//! mirrored as the tree of its members. A gzip-compressed shard (`.tar.gz`, `.tgz`) is not
//! seekable: it is inflated once, with progress on stderr, into a `.tar` beside the index (in
//! `--index-dir`), and that file is served; the index records both, so a changed `.tar.gz`
//! inflates again.

use super::{Format, Sample, Scan, list_dir, mtime_of, read_at};
use anyhow::{Context, Result, bail};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const IMAGE_EXTS: [&str; 10] = [
    "jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "gif",
];
const LABEL_EXTS: [&str; 4] = ["cls", "cls2", "class", "label"];

fn shards(src: &Path) -> Result<Vec<PathBuf>> {
    if let Some(v) = super::brace_files(src) {
        return v;
    }
    if src.is_dir() {
        let v = list_dir(src, |n| {
            n.ends_with(".tar") || n.ends_with(".tar.gz") || n.ends_with(".tgz")
        })?;
        if v.is_empty() {
            bail!("no .tar files in {}", src.display());
        }
        Ok(v)
    } else {
        Ok(vec![src.to_path_buf()])
    }
}

fn is_gzip(p: &Path) -> bool {
    read_at(p, 0, 2).is_ok_and(|h| h == [0x1f, 0x8b])
}

fn is_tar(p: &Path) -> std::result::Result<(), String> {
    let head = if is_gzip(p) {
        let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
        let mut h = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(flate2::read::MultiGzDecoder::new(f), 512),
            &mut h,
        )
        .map_err(|e| format!("{}: not a readable gzip stream ({e})", p.display()))?;
        h
    } else {
        read_at(p, 0, 512).map_err(|e| e.to_string())?
    };
    if head.len() == 512 && &head[257..262] == b"ustar" {
        Ok(())
    } else {
        Err(format!("{} has no ustar header", p.display()))
    }
}

/// Ok when `src` is a tar file or a directory of `.tar` files.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    let v = shards(src).map_err(|e| e.to_string())?;
    is_tar(&v[0])
}

struct Member {
    key: String,
    ext: String,
    dir: String,
    base: String,
    pos: u64,
    size: u64,
}

fn split(path: &str) -> (String, String, String, String) {
    let (dir, base) = match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    };
    let (stem, ext) = match base.find('.') {
        Some(i) => (&base[..i], &base[i + 1..]),
        None => (base, ""),
    };
    let key = if dir.is_empty() {
        stem.to_string()
    } else {
        format!("{dir}/{stem}")
    };
    (
        key,
        ext.to_ascii_lowercase(),
        dir.to_string(),
        base.to_string(),
    )
}

/// How many inflated bytes are written between two checks of the free space, bytes.
const INFLATE_CHECK: u64 = 64 << 20;

/// Most free space an inflation leaves untouched, bytes: a gzip bomb is stopped with this much
/// still free, so the rest of the machine keeps working while the partial copy is removed.
const INFLATE_FLOOR_CAP: u64 = 1 << 30;

/// What `dir`'s file system can take before its free space falls under 5% of its size (the
/// block cache's floor, mountpoint-s3's default) or under [`INFLATE_FLOOR_CAP`], whichever is
/// less, bytes. The cap keeps a large file system from refusing a shard with gigabytes free: 5%
/// of a 250 GB disk is 12.5 GB.
fn inflate_room(dir: &Path) -> Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir)?;
    let free = s.blocks_available() * s.fragment_size();
    let floor = (s.blocks() * s.fragment_size() / 20).min(INFLATE_FLOOR_CAP);
    Ok(free.saturating_sub(floor))
}

/// Inflates gzip shard `gz` into `dir` once (kept while `gz` keeps its size and mtime; written
/// to a temporary name and renamed), printing progress to stderr. Returns the `.tar`'s path.
/// The copy inflated from an earlier version of the same shard is removed, so the directory
/// holds one `.tar` per shard however often it changes.
///
/// # Errors
/// A damaged gzip stream, or one that inflates past what `dir`'s file system holds beside 5%
/// of its size (at most 1 GiB) kept free (checked every [`INFLATE_CHECK`] bytes): refused
/// naming `gz`, the partial copy removed.
fn inflate(gz: &Path, dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(gz)?;
    let shard = xxhash_rust::xxh3::xxh3_64(gz.as_os_str().as_encoded_bytes());
    let key = xxhash_rust::xxh3::xxh3_64(
        format!(
            "{}\0{}\0{}.{}",
            gz.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        )
        .as_bytes(),
    );
    let name = gz
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".tar.gz")
        .or_else(|| name.strip_suffix(".tgz"))
        .or_else(|| name.strip_suffix(".gz"))
        .unwrap_or(&name);
    let out = dir.join(format!("{shard:016x}-{key:016x}-{stem}.tar"));
    if out.is_file() {
        return Ok(out);
    }
    let older = format!("{shard:016x}-");
    std::fs::create_dir_all(dir)?;
    crate::eprintln_lossy!(
        "loosefs: inflating {} once into {}",
        gz.display(),
        out.display()
    );
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut r =
        flate2::read::MultiGzDecoder::new(std::io::BufReader::new(std::fs::File::open(gz)?));
    let mut buf = vec![0u8; 1 << 20];
    let (mut done, mut shown, mut room) = (0u64, 0u64, 0u64);
    loop {
        let n = std::io::Read::read(&mut r, &mut buf)
            .with_context(|| format!("{}: damaged gzip stream after {done} bytes", gz.display()))?;
        if n == 0 {
            break;
        }
        if n as u64 > room {
            room = inflate_room(dir)
                .with_context(|| {
                    format!("{}: cannot inflate into {}", gz.display(), dir.display())
                })?
                .min(INFLATE_CHECK);
            if (n as u64) > room {
                bail!(
                    "{}: inflates to more than {done} bytes, more than {} can hold beside 5% of \
                     its size (at most 1 GiB) kept free (a gzip bomb, or too little space: give \
                     --index-dir on a larger file system)",
                    gz.display(),
                    dir.display()
                );
            }
        }
        room -= n as u64;
        std::io::Write::write_all(&mut tmp, &buf[..n])?;
        done += n as u64;
        if done - shown >= 256 << 20 {
            crate::eprintln_lossy!("loosefs: inflated {} MB of {}", done >> 20, gz.display());
            shown = done;
        }
    }
    tmp.as_file().sync_all()?;
    tmp.persist(&out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    for e in std::fs::read_dir(dir)?.flatten() {
        let n = e.file_name();
        let n = n.to_string_lossy();
        if n.starts_with(&older) && e.path() != out {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(out)
}

/// Scans every shard's headers (data is skipped by seeking). Gzip shards are inflated into
/// `inflate_dir` first (see [`inflate`]); their `.tar` is what the scan returns as the object,
/// and `derived` pairs it with the `.tar.gz`.
pub fn scan(src: &Path, label_ext: Option<&str>, inflate_dir: &Path) -> Result<Scan> {
    let mut derived = Vec::new();
    let mut objects = Vec::new();
    for p in shards(src)? {
        if is_gzip(&p) {
            let t = inflate(&p, inflate_dir)?;
            derived.push((t.clone(), p));
            objects.push(t);
        } else {
            objects.push(p);
        }
    }
    let mut s = scan_tars(src, objects, label_ext)?;
    s.derived = derived;
    Ok(s)
}

/// The regular members of tar `p` (object `k`), in archive order, with their data's position.
/// `__x__` members are skipped. Errors: not a tar, a damaged header, a member that climbs
/// out of the archive or runs past the end of the file.
fn members_of(k: u32, p: &Path) -> Result<Vec<(u32, Member)>> {
    is_tar(p).map_err(anyhow::Error::msg)?;
    let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
    let len = f.metadata()?.len();
    let mut ar = tar::Archive::new(f);
    let entries = ar
        .entries_with_seek()
        .with_context(|| format!("{}: not a readable tar", p.display()))?;
    let mut members = Vec::new();
    for e in entries {
        let e = e.with_context(|| format!("{}: damaged tar header", p.display()))?;
        if !e.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let name = name.trim_start_matches("./").to_string();
        if name.split('/').any(|c| c == "..") || name.starts_with('/') {
            bail!("{}: member {name:?} climbs out of the archive", p.display());
        }
        let (key, ext, dir, base) = split(&name);
        if base.starts_with("__") && base[2..].contains("__") {
            continue;
        }
        let (pos, size) = (e.raw_file_position(), e.size());
        if pos.checked_add(size).is_none_or(|end| end > len) {
            bail!(
                "{}: member {name} ends at byte {}, past the end of the file ({len} bytes): truncated shard",
                p.display(),
                pos.saturating_add(size)
            );
        }
        let m = Member {
            key,
            ext,
            dir,
            base,
            pos,
            size,
        };
        members.push((k, m));
    }
    Ok(members)
}

/// The WebDataset sample of `group` (consecutive members of one key in object `obj` at
/// `path`): its image member, the others as extra fields, the label from the first label
/// member, the class name from a short one-word `.txt`. `None` when the group has no image.
fn sample_of(
    group: &[(u32, Member)],
    path: &Path,
    mtime: i64,
    is_label: &dyn Fn(&str) -> bool,
) -> Result<Option<Sample>> {
    let small = |m: &Member| -> Result<String> {
        let b = read_at(path, m.pos, m.size.min(256) as usize)?;
        Ok(String::from_utf8_lossy(&b).trim().to_string())
    };
    let image = group
        .iter()
        .find(|(_, m)| IMAGE_EXTS.contains(&m.ext.rsplit('.').next().unwrap_or("")));
    let Some((obj, img)) = image else {
        return Ok(None);
    };
    let mut s = Sample {
        object: *obj,
        range: img.pos..img.pos + img.size,
        name: format!(
            "{}.{}",
            img.key.rsplit('/').next().unwrap_or(&img.key),
            img.ext
        ),
        mtime,
        ..Sample::default()
    };
    for (_, m) in group {
        if !std::ptr::eq(m, img) {
            s.extra.push((m.ext.clone(), m.pos..m.pos + m.size));
        }
        if is_label(&m.ext) && s.label.is_none() {
            let t = small(m)?;
            s.label = Some(t.parse().with_context(|| {
                format!(
                    "{}: {}.{} holds {t:?}, not an integer label",
                    path.display(),
                    m.key,
                    m.ext
                )
            })?);
        } else if m.ext == "txt" && m.size <= 64 {
            let t = small(m)?;
            if !t.is_empty() && !t.contains(char::is_whitespace) {
                s.class = Some(t);
            }
        }
    }
    Ok(Some(s))
}

fn scan_tars(src: &Path, objects: Vec<PathBuf>, label_ext: Option<&str>) -> Result<Scan> {
    let is_label = |ext: &str| match label_ext {
        Some(l) => ext == l,
        None => LABEL_EXTS.contains(&ext),
    };
    let mut members: Vec<(u32, Member)> = Vec::new();
    for (k, p) in objects.iter().enumerate() {
        members.extend(members_of(k as u32, p)?);
    }
    let mtimes: Vec<i64> = objects.iter().map(|p| mtime_of(p)).collect();
    let fields: BTreeSet<String> = members.iter().map(|(_, m)| m.ext.clone()).collect();
    let labelled = members.iter().any(|(_, m)| is_label(&m.ext));
    if let (Some(l), false) = (label_ext, labelled) {
        bail!(
            "{}: --label {l}: no member has the extension .{l}",
            src.display()
        );
    }
    if !labelled {
        let samples = (members.iter())
            .map(|(k, m)| Sample {
                object: *k,
                range: m.pos..m.pos + m.size,
                dir: Some(m.dir.clone()),
                name: m.base.clone(),
                mtime: mtimes[*k as usize],
                ..Sample::default()
            })
            .collect();
        return Ok(tar_scan(
            objects,
            samples,
            fields,
            "none: the archive's own tree",
        ));
    }
    let mut samples = Vec::new();
    for group in members.chunk_by(|a, b| a.1.key == b.1.key && a.0 == b.0) {
        let obj = group[0].0 as usize;
        if let Some(s) = sample_of(group, &objects[obj], mtimes[obj], &is_label)? {
            samples.push(s);
        }
    }
    Ok(tar_scan(
        objects,
        samples,
        fields,
        "WebDataset .cls (as stored); class names from .txt when each label has one word",
    ))
}

fn tar_scan(
    objects: Vec<PathBuf>,
    samples: Vec<Sample>,
    fields: BTreeSet<String>,
    labels: &str,
) -> Scan {
    Scan {
        format: Format::Tar,
        derived: Vec::new(),
        objects,
        chunks: Vec::new(),
        samples,
        fields: fields.into_iter().collect(),
        compression: "none".into(),
        labels: labels.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WebDataset shard: `(key.ext, bytes)` members, written by the tar crate.
    fn shard(dir: &Path, name: &str, members: &[(&str, &[u8])]) -> PathBuf {
        let p = dir.join(name);
        let mut b = ::tar::Builder::new(std::fs::File::create(&p).unwrap());
        for (n, data) in members {
            let mut h = ::tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, n, *data).unwrap();
        }
        b.finish().unwrap();
        p
    }

    #[test]
    fn webdataset_samples_are_grouped_by_key_and_served_in_place() {
        let d = tempfile::tempdir().unwrap();
        let p = shard(
            d.path(),
            "s-000.tar",
            &[
                ("a/0001.jpg", b"\xff\xd8one"),
                ("a/0001.cls", b"3"),
                ("a/0002.jpg", b"\xff\xd8two!"),
                ("a/0002.cls", b"5"),
            ],
        );
        let s = scan(&p, None, d.path()).unwrap();
        assert_eq!(s.samples.len(), 2);
        let bytes = std::fs::read(&p).unwrap();
        let got: Vec<&[u8]> = s
            .samples
            .iter()
            .map(|x| &bytes[x.range.start as usize..x.range.end as usize])
            .collect();
        assert_eq!(got, vec![&b"\xff\xd8one"[..], &b"\xff\xd8two!"[..]]);
        assert_eq!(
            s.samples.iter().map(|x| x.label).collect::<Vec<_>>(),
            vec![Some(3), Some(5)]
        );
    }

    #[test]
    #[ignore = "needs root: mounts a 32 MiB tmpfs as the index directory's file system"]
    fn a_gzip_bomb_is_refused_before_it_fills_the_index_disk() {
        let d = tempfile::tempdir().unwrap();
        let small = crate::testutil::SmallTmpfs::mount(d.path(), "small", "32m");
        let fs = small.path();
        // 256 MiB of zeros after a valid member: about 250 KB of gzip.
        let tar = shard(d.path(), "s.tar", &[("k.jpg", b"\xff\xd8a")]);
        let gz = d.path().join("bomb.tar.gz");
        let mut e = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::best(),
        );
        std::io::Write::write_all(&mut e, &std::fs::read(&tar).unwrap()).unwrap();
        for _ in 0..256 {
            std::io::Write::write_all(&mut e, &[0u8; 1 << 20]).unwrap();
        }
        e.finish().unwrap();
        let dir = fs.join("inflated");
        let err = format!("{:#}", inflate(&gz, &dir).unwrap_err());
        assert!(err.contains("bomb.tar.gz") && err.contains("5%"), "{err}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "nothing half-written is left: {left:?}");
    }

    #[test]
    fn a_changed_gzip_shard_replaces_its_inflated_copy() {
        let d = tempfile::tempdir().unwrap();
        let tar = shard(
            d.path(),
            "s.tar",
            &[("k.jpg", b"\xff\xd8a"), ("k.cls", b"1")],
        );
        let gz = d.path().join("s.tar.gz");
        let write_gz = |extra: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(
                std::fs::File::create(&gz).unwrap(),
                flate2::Compression::fast(),
            );
            std::io::Write::write_all(&mut e, &std::fs::read(&tar).unwrap()).unwrap();
            std::io::Write::write_all(&mut e, extra).unwrap();
            e.finish().unwrap();
        };
        let dir = d.path().join("inflated");
        write_gz(b"");
        let a = inflate(&gz, &dir).unwrap();
        assert_eq!(inflate(&gz, &dir).unwrap(), a, "kept while unchanged");
        write_gz(&[0u8; 1024]);
        let b = inflate(&gz, &dir).unwrap();
        assert_ne!(a, b);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(left, vec![b], "one inflated copy per shard");
    }

    #[test]
    fn truncated_and_damaged_shards_are_refused_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = shard(
            d.path(),
            "s.tar",
            &[("k.jpg", &[7u8; 3000]), ("k.cls", b"1")],
        );
        let good = std::fs::read(&p).unwrap();
        // Cut inside the first member's data.
        std::fs::write(&p, &good[..1500]).unwrap();
        let e = format!("{:#}", scan(&p, None, d.path()).unwrap_err());
        assert!(e.contains("s.tar"), "{e}");
        // A header whose size field claims more than the file holds.
        let mut bad = good.clone();
        bad[124..136].copy_from_slice(b"77777777777\0");
        std::fs::write(&p, &bad).unwrap();
        let e = format!("{:#}", scan(&p, None, d.path()).unwrap_err());
        assert!(e.contains("s.tar"), "{e}");
    }
}
