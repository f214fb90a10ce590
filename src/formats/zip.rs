//! Zip archives (any zip writer; not a loosefs pack, which mounts natively): the central
//! directory read with the `zip` crate, member names taken only through its `enclosed_name`
//! (a name that is absolute or climbs out with `..` refuses the archive, naming the member).
//! The tree of members is shown as is; STORED members are served in place, deflated members
//! through the chunk cache (each member a chunk, decompressed whole on first read), all checked
//! against the CRC-32 the archive records. Other methods (bzip2, zstd in zip, ...) are refused
//! with the member named: `loosefs pack` converts such an archive into a native pack.

use super::{ChunkSpec, Format, Sample, Scan, mtime_of, read_at};
use crate::storage::chunks::Codec;
use anyhow::{Context, Result, bail};

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

/// Reads the central directory.
pub fn scan(src: &std::path::Path) -> Result<Scan> {
    let f = std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    let mut z = zip::ZipArchive::new(f)
        .with_context(|| format!("{}: not a readable zip archive", src.display()))?;
    let mtime = mtime_of(src);
    let mut samples = Vec::new();
    let mut objects = vec![src.to_path_buf()];
    let mut chunks = vec![None];
    let mut other = Vec::new();
    for i in 0..z.len() {
        let m = z
            .by_index_raw(i)
            .with_context(|| format!("{}: damaged central directory entry {i}", src.display()))?;
        let Some(name) = m.enclosed_name() else {
            bail!(
                "{}: member {:?} climbs out of the archive",
                src.display(),
                m.name()
            );
        };
        if m.is_dir() {
            continue;
        }
        let name = name.to_string_lossy().into_owned();
        let start = m.data_start();
        let (object, range) = match m.compression() {
            zip::CompressionMethod::Stored => (0, start..start + m.compressed_size()),
            zip::CompressionMethod::Deflated => {
                objects.push(src.to_path_buf());
                chunks.push(Some(ChunkSpec {
                    codec: Codec::Deflate,
                    offset: start,
                    stored_len: m.compressed_size(),
                    len: m.size(),
                    crc32: Some(m.crc32()),
                    parquet: None,
                }));
                (objects.len() as u32 - 1, 0..m.size())
            }
            _ => {
                other.push(format!("{name} ({:?})", m.compression()));
                continue;
            }
        };
        let (dir, base) = match name.rfind('/') {
            Some(i) => (name[..i].to_string(), name[i + 1..].to_string()),
            None => (String::new(), name.clone()),
        };
        samples.push(Sample {
            object,
            range,
            dir: Some(dir),
            name: base,
            crc32: Some(m.crc32()),
            mtime,
            ..Sample::default()
        });
    }
    if !other.is_empty() {
        bail!(
            "{}: {} member(s) compressed with a method loosefs does not serve (first: {}); convert with `loosefs pack {} OUT.pack`",
            src.display(),
            other.len(),
            other[0],
            src.display()
        );
    }
    // Storage order: stored members by offset, then each deflated member's chunk.
    samples.sort_by_key(|s| (s.object, s.range.start));
    let deflated = chunks.iter().filter(|c| c.is_some()).count();
    Ok(Scan {
        format: Format::Zip,
        derived: Vec::new(),
        objects,
        chunks,
        samples,
        fields: vec!["member".into()],
        compression: if deflated > 0 {
            format!("{deflated} deflated member(s), served through the chunk cache")
        } else {
            "none (stored)".into()
        },
        labels: "none: the archive's own tree".into(),
    })
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
