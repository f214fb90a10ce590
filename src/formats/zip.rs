//! Zip archives (any zip writer; not a loosefs pack, which mounts natively): the central
//! directory read with the `zip` crate, member names checked by the same rules `loosefs pack`
//! applies (a name that is absolute, climbs out with `..`, is not UTF-8, holds a backslash or
//! NUL, or appears twice refuses the archive, naming the member).
//! The tree of members is shown as is; STORED members are served in place, deflated members
//! through the chunk cache (each member a chunk, decompressed whole on first read), all checked
//! against the CRC-32 the archive records. Other methods (bzip2, zstd in zip, ...) are refused
//! with the member named: `loosefs pack` converts such an archive into a native pack.

use super::{ChunkSpec, Format, Sample, Scan, mtime_of, read_at};

pub mod table;
use crate::storage::chunks::Codec;
use anyhow::{Context, Result, bail};
use std::io::Cursor;
use std::path::Path;

/// Ok when `src` is a file starting with a zip local header or ending with an end record.
pub fn sniff(src: &std::path::Path) -> std::result::Result<(), String> {
    if !src.is_file() {
        return Err(format!("{} is not a file", src.display()));
    }
    let head = read_at(src, 0, 4).map_err(|e| e.to_string())?;
    if head == b"PK\x03\x04" || head == b"PK\x05\x06" {
        Ok(())
    } else {
        Err(format!("{} has no zip signature", src.display()))
    }
}

/// The scan being built from an archive's members, whichever reader placed them (the `zip`
/// crate in [`scan`], the central directory alone in [`table::scan`]).
pub(crate) struct Members<'a> {
    src: &'a Path,
    mtime: i64,
    objects: Vec<std::path::PathBuf>,
    chunks: Vec<Option<ChunkSpec>>,
    samples: Vec<Sample>,
    /// Members stored with a method loosefs does not serve: name (method).
    other: Vec<String>,
    /// The first member whose directory entry contradicts itself: why.
    damaged: Option<String>,
}

impl<'a> Members<'a> {
    /// No member yet; object 0 is the archive `src` itself.
    pub(crate) fn new(src: &'a Path) -> Members<'a> {
        Members {
            src,
            mtime: mtime_of(src),
            objects: vec![src.to_path_buf()],
            chunks: vec![None],
            samples: Vec::new(),
            other: Vec::new(),
            damaged: None,
        }
    }

    /// Adds the member `name` (its checked components joined by `/`): its data at byte `start`
    /// of the archive, `compressed` bytes stored, `size` once inflated, with CRC-32 `crc32`.
    /// `method`: `Ok(false)` STORED (served in place, object 0), `Ok(true)` deflated (a new
    /// chunk object), `Err(shown)` another method (refused by [`Self::finish`]).
    pub(crate) fn add(
        &mut self,
        name: String,
        method: Result<bool, String>,
        start: u64,
        compressed: u64,
        size: u64,
        crc32: u32,
    ) {
        // The CRC-32 of no bytes is 0: an empty member with another CRC-32 was cut (its
        // directory says 0 bytes where its data says more), and would be served as an empty
        // file with no check to fail.
        if size == 0 && crc32 != 0 {
            self.damaged.get_or_insert(format!(
                "member {name} is 0 bytes long by the central directory, but its CRC-32 is \
                 {crc32:08x} (an empty member's is 00000000): the directory is damaged"
            ));
            return;
        }
        let (object, range) = match method {
            Ok(false) => (0, start..start + compressed),
            Ok(true) => {
                self.objects.push(self.src.to_path_buf());
                self.chunks.push(Some(ChunkSpec {
                    codec: Codec::Deflate,
                    offset: start,
                    stored_len: compressed,
                    len: size,
                    crc32: Some(crc32),
                    parquet: None,
                }));
                (self.objects.len() as u32 - 1, 0..size)
            }
            Err(shown) => return self.other.push(format!("{name} ({shown})")),
        };
        let (dir, base) = match name.rfind('/') {
            Some(i) => (name[..i].to_string(), name[i + 1..].to_string()),
            None => (String::new(), name),
        };
        self.samples.push(Sample {
            object,
            range,
            dir: Some(dir),
            name: base,
            crc32: Some(crc32),
            mtime: self.mtime,
            ..Sample::default()
        });
    }

    /// The scan, samples in storage order (stored members by offset, then each deflated
    /// member's chunk). Errors: a member stored with another method (the archive named, the
    /// first such member shown, `loosefs pack` offered).
    pub(crate) fn finish(mut self) -> Result<Scan> {
        let src = self.src;
        if let Some(why) = &self.damaged {
            bail!("{}: {why}", src.display());
        }
        if let Some(first) = self.other.first() {
            bail!(
                "{}: {} member(s) compressed with a method loosefs does not serve (first: {first}); convert with `loosefs pack {} OUT.pack`",
                src.display(),
                self.other.len(),
                src.display()
            );
        }
        self.samples.sort_by_key(|s| (s.object, s.range.start));
        let deflated = self.chunks.iter().filter(|c| c.is_some()).count();
        Ok(Scan {
            format: Format::Zip,
            derived: Vec::new(),
            objects: self.objects,
            chunks: self.chunks,
            samples: self.samples,
            fields: vec!["member".into()],
            compression: if deflated > 0 {
                format!("{deflated} deflated member(s), served through the chunk cache")
            } else {
                "none (stored)".into()
            },
            labels: "none: the archive's own tree".into(),
        })
    }
}

/// Reads the central directory. Member names follow the same rules as `loosefs pack`'s
/// ([`member_path`]; a name twice refuses the archive, [`refuse_merged_duplicates`]); an
/// encrypted member refuses it; symbolic links are left out, as `pack` leaves them out.
pub fn scan(src: &std::path::Path) -> Result<Scan> {
    let f = std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    // SAFETY: a read-only map of a dataset file that must not change while indexed.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let mut z = zip::ZipArchive::new(Cursor::new(&map[..]))
        .with_context(|| format!("{}: not a readable zip archive", src.display()))?;
    refuse_merged_duplicates(src, &map, &mut z)?;
    let mut members = Members::new(src);
    for i in 0..z.len() {
        let m = z
            .by_index_raw(i)
            .with_context(|| format!("{}: damaged central directory entry {i}", src.display()))?;
        if m.is_dir() || m.unix_mode().unwrap_or(0) & libc::S_IFMT == libc::S_IFLNK {
            member_parts(src, &m)?; // a directory's name is checked all the same
            continue;
        }
        let name = member_parts(src, &m)?.join("/");
        let method = match m.compression() {
            zip::CompressionMethod::Stored => Ok(false),
            zip::CompressionMethod::Deflated => Ok(true),
            other => Err(format!("{other:?}")),
        };
        let (start, compressed, size) = (m.data_start(), m.compressed_size(), m.size());
        members.add(name, method, start, compressed, size, m.crc32());
    }
    members.finish()
}

/// The checked components of member `m` of archive `src`, by the rules `loosefs pack` and the
/// mount share ([`member_path`]). Errors, naming the archive and member: a name that escapes or
/// is not UTF-8, a file that names nothing, an encrypted file.
pub(crate) fn member_parts(
    src: &Path,
    m: &zip::read::ZipFile<'_, Cursor<&[u8]>>,
) -> Result<Vec<String>> {
    let parts = member_path(m.name_raw()).map_err(|why| {
        anyhow::anyhow!(
            "{}: member {:?} {why}; refusing the archive",
            src.display(),
            String::from_utf8_lossy(m.name_raw())
        )
    })?;
    let file = !m.is_dir() && m.unix_mode().unwrap_or(0) & libc::S_IFMT != libc::S_IFLNK;
    if file && parts.is_empty() {
        bail!(
            "{}: member {:?} names no file (empty, or only `.`); refusing the archive",
            src.display(),
            m.name()
        );
    }
    if file && m.encrypted() {
        bail!(
            "{}: member {:?} is encrypted; loosefs cannot read it",
            src.display(),
            m.name()
        );
    }
    Ok(parts)
}

/// The components of zip member name `raw`, resolved lexically: `/`-separated, empty and `.`
/// components dropped, `..` removing the component before it. Errors (the reason): not UTF-8,
/// absolute, a NUL or backslash in it, or a `..` that would climb out of the archive's tree.
pub(crate) fn member_path(raw: &[u8]) -> Result<Vec<String>, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "is not UTF-8".to_string())?;
    if name.starts_with('/') {
        return Err("is an absolute path (it would escape the extracted tree)".into());
    }
    if name.contains('\0') || name.contains('\\') {
        return Err("contains a NUL or a backslash".into());
    }
    let mut parts: Vec<String> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err("would escape the extracted tree (`..` above its top)".into());
                }
            }
            c => parts.push(c.to_string()),
        }
    }
    Ok(parts)
}

/// Refuses an archive whose central directory names a member twice. The zip reader keeps one
/// entry per name, so a duplicate shows as a central-directory record no kept entry starts at:
/// the records of the kept entries must tile the central directory from its start, with no
/// record left after the last one.
pub(crate) fn refuse_merged_duplicates(
    src: &Path,
    map: &[u8],
    z: &mut zip::ZipArchive<Cursor<&[u8]>>,
) -> Result<()> {
    let mut starts = Vec::with_capacity(z.len());
    for k in 0..z.len() {
        starts.push(z.by_index_raw(k)?.central_header_start() as usize);
    }
    starts.sort_unstable();
    let record_end = |at: usize| -> Option<usize> {
        let h = map.get(at..at + 46)?;
        let len = |o: usize| usize::from(u16::from_le_bytes([h[o], h[o + 1]]));
        Some(at + 46 + len(28) + len(30) + len(32))
    };
    let name_at = |at: usize| -> String {
        let n = map
            .get(at + 28..at + 30)
            .map_or(0, |b| usize::from(u16::from_le_bytes([b[0], b[1]])));
        String::from_utf8_lossy(map.get(at + 46..at + 46 + n).unwrap_or(&[])).into_owned()
    };
    let mut expected = z.central_directory_start() as usize;
    for at in starts.iter().copied().chain(std::iter::once(usize::MAX)) {
        let dropped = if at == usize::MAX {
            map.get(expected..expected + 4) == Some(b"PK\x01\x02")
        } else {
            at != expected
        };
        if dropped {
            bail!(
                "{}: member {:?} appears twice in the archive; refusing it (which copy is meant?)",
                src.display(),
                name_at(expected)
            );
        }
        if at == usize::MAX {
            break;
        }
        expected = record_end(at).context("truncated central directory")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn archive(p: &std::path::Path, members: &[(&str, &[u8], bool)]) {
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(p).unwrap());
        for (name, data, deflate) in members {
            let m = if *deflate {
                ::zip::CompressionMethod::Deflated
            } else {
                ::zip::CompressionMethod::Stored
            };
            let o = ::zip::write::SimpleFileOptions::default().compression_method(m);
            w.start_file(*name, o).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn a_member_cut_to_0_bytes_in_the_central_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cut.zip");
        // A member whose bytes were cut away, its headers saying 0 bytes but still carrying
        // the CRC-32 of the 100,582 it held (no gap is left for the layout checks to see).
        archive(&p, &[("c1/x.jpg", b"", false), ("c1/y.jpg", b"ok", false)]);
        let mut b = std::fs::read(&p).unwrap();
        let crc = crc32fast::hash(&[7u8; 100_582]).to_le_bytes();
        let local = b.windows(4).position(|w| w == b"PK\x03\x04").unwrap();
        b[local + 14..local + 18].copy_from_slice(&crc);
        let cd = b.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
        b[cd + 16..cd + 20].copy_from_slice(&crc);
        std::fs::write(&p, &b).unwrap();
        for r in [scan(&p), table::scan(&p)] {
            let Err(e) = r else {
                panic!("a cut member was accepted")
            };
            let e = format!("{e:#}");
            assert!(e.contains("c1/x.jpg") && e.contains("0 bytes"), "{e}");
        }
    }

    #[test]
    fn stored_members_are_served_in_place_and_deflated_ones_as_chunks() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.zip");
        let big = vec![9u8; 50_000];
        archive(
            &p,
            &[
                ("c1/x.jpg", b"\xff\xd8stored", false),
                ("c2/y.jpg", &big, true),
            ],
        );
        let s = scan(&p).unwrap();
        assert_eq!(s.samples.len(), 2);
        let bytes = std::fs::read(&p).unwrap();
        let x = &s.samples[0];
        assert_eq!(x.dir.as_deref(), Some("c1"));
        assert_eq!(
            &bytes[x.range.start as usize..x.range.end as usize],
            b"\xff\xd8stored"
        );
        assert_eq!(x.crc32, Some(crc32fast::hash(b"\xff\xd8stored")));
        // The deflated member is an object of its own, decompressed through the chunk cache.
        let y = &s.samples[1];
        let spec = s.chunks[y.object as usize].as_ref().expect("a chunk");
        assert_eq!(spec.len, 50_000);
        assert_eq!(y.range, 0..50_000);
    }

    #[test]
    fn escaping_names_and_garbage_are_refused_naming_the_archive() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("evil.zip");
        archive(&p, &[("../up.jpg", b"x", false)]);
        let e = format!("{:#}", scan(&p).unwrap_err());
        assert!(e.contains("evil.zip") && e.contains("../up.jpg"), "{e}");
        std::fs::write(&p, b"PK\x03\x04 not really").unwrap();
        let e = format!("{:#}", scan(&p).unwrap_err());
        assert!(e.contains("evil.zip"), "{e}");
    }
}
