//! Building a foreign dataset's index from its scan. `--verify full`: every sample read once
//! (CRC-32, checked against the format's own where it has one; JPEG dimensions), in bounded memory (a
//! compressed chunk is streamed through its decompressor while its own samples are probed,
//! one sample held at a time per worker thread). `--verify lazy`: each plain sample's head
//! only, for its JPEG header (compressed chunks are streamed as in full); CRC-32s the format
//! does not store are marked unknown ([`crate::pack::index::UNCHECKED`]). Then the
//! tree the mount shows (class directories, names made unique).

use super::{Header, ObjectEntry, object_entry};
use crate::formats::{Sample, Scan, ScanOptions, name_classes};
use crate::pack::index::{self, Node, Record};
use crate::pack::jpeg::{JpegInfo, probe};
use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What one pass over a sample's bytes found: its CRC-32 (`None`: not read whole, and the
/// format stores none) and, for a JPEG, its header.
type Probed = (Option<u32>, Option<JpegInfo>);

/// A lazy index reads this much of a sample for its JPEG header first, bytes; more (up to
/// [`HEAD`]) only for a JPEG whose frame header lies further.
const LAZY_HEAD: u64 = 16 << 10;

/// The JPEG probe reads a sample's first 4 MiB at most: a frame header further in (behind
/// metadata segments of 64 KiB each) is not looked for, and the sample counts as not a JPEG.
const HEAD: usize = 4 << 20;

/// One sample's bytes as they pass, in pieces: their CRC-32 and the head the JPEG probe reads.
#[derive(Default)]
struct Probe {
    crc: crc32fast::Hasher,
    head: Vec<u8>,
}

impl Probe {
    fn update(&mut self, piece: &[u8]) {
        self.crc.update(piece);
        let room = HEAD.saturating_sub(self.head.len()).min(piece.len());
        self.head.extend_from_slice(&piece[..room]);
    }

    /// Checks the sample's CRC-32 against the one its format stores (`s.crc32`), and probes it.
    fn finish(self, scan: &Scan, s: &Sample) -> Result<Probed> {
        let crc = self.crc.finalize();
        if let Some(want) = s.crc32.filter(|&w| w != crc) {
            return Err(crate::exit_code::refuse(
                crate::exit_code::ExitKind::Damaged,
                format!(
                    "{}: {} fails its CRC-32 ({crc:08x}, the archive says {want:08x})",
                    scan.objects[s.object as usize].display(),
                    s.name
                ),
            ));
        }
        Ok((Some(crc), probe(&self.head)))
    }
}

/// The JPEG header of the sample at `range` of `file`: its first [`LAZY_HEAD`] bytes, then up
/// to [`HEAD`] when they start a JPEG whose frame header was not among them.
fn probe_head(
    file: &std::fs::File,
    range: &std::ops::Range<u64>,
) -> std::io::Result<Option<JpegInfo>> {
    let len = range.end - range.start;
    let mut head = vec![0u8; len.min(LAZY_HEAD) as usize];
    file.read_exact_at(&mut head, range.start)?;
    let found = probe(&head);
    if found.is_some() || len <= LAZY_HEAD || !head.starts_with(&[0xff, 0xd8]) {
        return Ok(found);
    }
    let mut head = vec![0u8; len.min(HEAD as u64) as usize];
    file.read_exact_at(&mut head, range.start)?;
    Ok(probe(&head))
}

/// Reads every sample of `scan` once and probes it. Plain samples are read from their files in
/// parallel; each compressed chunk is streamed by one worker, which probes its samples as
/// they pass, so memory holds one sample per worker thread, never a whole chunk.
/// `--verify lazy` ([`crate::formats::Verify::Lazy`]) reads only the plain samples' heads
/// ([`probe_head`]); their CRC-32 is the format's own, if any.
fn probe_all(
    scan: &Scan,
    objects: &[ObjectEntry],
    lazy: bool,
    progress: crate::progress::Progress,
) -> Result<Vec<Probed>> {
    // The samples read for the index: their heads, or all of them with `--verify full`.
    let bar = progress.meter(
        "index",
        crate::progress::Unit::Samples,
        Some(scan.samples.len() as u64),
    );
    let plain = crate::formats::open_files(scan.objects.iter().map(|p| p.as_path()))?;
    let mut by_chunk: Vec<Vec<usize>> = vec![Vec::new(); objects.len()];
    let mut loose = Vec::new();
    for (i, s) in scan.samples.iter().enumerate() {
        match objects[s.object as usize].chunk {
            Some(_) => by_chunk[s.object as usize].push(i),
            None => loose.push(i),
        }
    }
    let read = |i: &usize| -> Result<(usize, Probed)> {
        let s = &scan.samples[*i];
        let path = &scan.objects[s.object as usize];
        let failed = || {
            let r = &s.range;
            format!(
                "cannot read {} bytes {}..{}",
                path.display(),
                r.start,
                r.end
            )
        };
        bar.inc(1);
        if lazy {
            let jpeg = probe_head(&plain[path], &s.range).with_context(failed)?;
            return Ok((*i, (s.crc32, jpeg)));
        }
        let mut p = Probe::default();
        let mut buf = vec![0u8; (s.range.end - s.range.start).min(1 << 20) as usize];
        let mut at = s.range.start;
        while at < s.range.end {
            let n = (s.range.end - at).min(buf.len() as u64) as usize;
            (plain[path].read_exact_at(&mut buf[..n], at)).with_context(failed)?;
            p.update(&buf[..n]);
            at += n as u64;
        }
        Ok((*i, p.finish(scan, s)?))
    };
    let mut found: Vec<(usize, Probed)> = loose.par_iter().map(read).collect::<Result<_>>()?;
    let chunked: Vec<Vec<(usize, Probed)>> = (objects.par_iter().zip(&by_chunk))
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(o, ids)| -> Result<Vec<(usize, Probed)>> {
            let c = o.chunk.as_ref().expect("chunked objects only");
            let mut ids = ids.clone();
            ids.sort_by_key(|&i| (scan.samples[i].range.start, scan.samples[i].range.end));
            let ranges: Vec<_> = ids.iter().map(|&i| scan.samples[i].range.clone()).collect();
            let mut out = Vec::with_capacity(ids.len());
            let (mut failed, mut p) = (None, Probe::default());
            c.with_file(&o.path, plain[&o.path].clone())
                .for_each_range(&ranges, |k, piece, last| {
                    p.update(piece);
                    if last {
                        bar.inc(1);
                        let (i, s) = (ids[k], &scan.samples[ids[k]]);
                        match std::mem::take(&mut p).finish(scan, s) {
                            Ok(p) => out.push((i, p)),
                            Err(e) => failed = Some(e),
                        }
                    }
                    failed
                        .as_ref()
                        .map_or(Ok(()), |_| Err(std::io::ErrorKind::Other.into()))
                })
                .or_else(|e| failed.take().map_or(Err(e.into()), Err))?;
            if out.len() < ids.len() {
                let s = &scan.samples[ids[out.len()]];
                bail!("{}: {} lies past its chunk", o.path.display(), s.name);
            }
            Ok(out)
        })
        .collect::<Result<_>>()?;
    found.extend(chunked.into_iter().flatten());
    bar.finish_and_clear();
    let mut out = vec![(None, None); scan.samples.len()];
    for (i, p) in found {
        out[i] = p;
    }
    Ok(out)
}

/// `name` made unique among the names `taken` under `parent`: keys may repeat across shards,
/// so later ones get the shard's stem as a prefix (`<stem>_<name>`, then `<stem>_<k>_<name>`).
fn unique_name(
    taken: &mut HashSet<(usize, String)>,
    parent: usize,
    name: &str,
    stem: &str,
) -> String {
    if taken.insert((parent, name.to_string())) {
        return name.to_string();
    }
    (0..)
        .map(|k| match k {
            0 => format!("{stem}_{name}"),
            _ => format!("{stem}_{k}_{name}"),
        })
        .find(|n| taken.insert((parent, n.clone())))
        .expect("an unbounded range")
}

/// The tree the mount shows: the root, class directories `dirs` (per sample), each sample's
/// file record at `bases[object] + range.start`. Returns the nodes and the class count.
fn tree(scan: &Scan, probed: &[Probed], dirs: &[Vec<String>], bases: &[u64]) -> (Vec<Node>, usize) {
    let root_mtime = (scan.objects.iter())
        .map(|p| crate::formats::mtime_of(p))
        .max()
        .unwrap_or(0);
    let dir = |parent, name: &str| Node {
        parent,
        name: name.as_bytes().to_vec(),
        record: Record {
            is_dir: true,
            mode: 0o40555,
            mtime_sec: root_mtime,
            ..Record::default()
        },
    };
    let mut nodes = vec![dir(None, "")];
    let mut dir_ids: HashMap<Vec<String>, usize> = HashMap::new();
    let mut taken: HashSet<(usize, String)> = HashSet::new();
    let mut classes = 0;
    for ((s, (crc, jpeg)), path) in scan.samples.iter().zip(probed).zip(dirs) {
        let mut parent = 0usize;
        for depth in 1..=path.len() {
            let key = path[..depth].to_vec();
            parent = *dir_ids.entry(key).or_insert_with(|| {
                nodes.push(dir(Some(parent), &path[depth - 1]));
                taken.insert((parent, path[depth - 1].clone()));
                classes += usize::from(depth == 1);
                nodes.len() - 1
            });
        }
        let stem = (scan.objects[s.object as usize].file_stem())
            .map(|x| x.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = unique_name(&mut taken, parent, &s.name, &stem);
        nodes.push(Node {
            parent: Some(parent),
            name: name.into_bytes(),
            record: Record {
                mode: 0o100444,
                data_off: bases[s.object as usize] + s.range.start,
                size: s.range.end - s.range.start,
                mtime_sec: s.mtime,
                crc32: crc.unwrap_or(0),
                components: match s.pixels {
                    Some(_) => crate::pack::index::PIXELS | 3,
                    None => jpeg.map_or(0, |j| j.components),
                } | if crc.is_some() {
                    0
                } else {
                    crate::pack::index::UNCHECKED
                },
                width: s.pixels.map_or(jpeg.map_or(0, |j| j.width), |p| p.0),
                height: s.pixels.map_or(jpeg.map_or(0, |j| j.height), |p| p.1),
                ..Record::default()
            },
        });
    }
    (nodes, classes)
}

/// Builds the index records of `scan`: reads every sample once (CRC-32, JPEG dimensions).
pub(super) fn build(
    src: &Path,
    scan: &Scan,
    opts: &ScanOptions,
    options: String,
    progress: crate::progress::Progress,
) -> Result<(Header, Vec<u8>)> {
    let mut objects: Vec<ObjectEntry> = Vec::with_capacity(scan.objects.len());
    for (k, p) in scan.objects.iter().enumerate() {
        let mut e = object_entry(p)?;
        e.chunk = scan.chunks.get(k).cloned().flatten();
        if let Some((_, from)) = scan.derived.iter().find(|(o, _)| o == p) {
            e.derived_from = Some(Box::new(object_entry(from)?));
        }
        objects.push(e);
    }
    let bases: Vec<u64> = (objects.iter())
        .scan(0u64, |next, o| {
            let b = *next;
            *next += o.served_len();
            Some(b)
        })
        .collect();
    let lazy = opts.verify == crate::formats::Verify::Lazy;
    let probed = if opts.tables_only {
        scan.samples.iter().map(|s| (s.crc32, None)).collect()
    } else {
        probe_all(scan, &objects, lazy, progress)?
    };
    let dirs = name_classes(&scan.samples, opts.class_names.as_deref());
    let (nodes, classes) = tree(scan, &probed, &dirs, &bases);
    let bytes = index::build(&nodes, 1)
        .with_context(|| format!("cannot build the index of {}", src.display()))?;
    let mirrored = scan.samples.iter().all(|s| s.dir.is_some());
    let header = Header {
        format: scan.format,
        source: src.to_path_buf(),
        objects,
        bases,
        fields: scan.fields.clone(),
        compression: scan.compression.clone(),
        labels: scan.labels.clone(),
        classes: if mirrored { 0 } else { classes },
        samples: scan.samples.len(),
        options,
        relative: false,
        remote: Vec::new(),
    };
    Ok((header, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_names_get_the_shard_stem_then_a_number() {
        let mut taken = HashSet::new();
        assert_eq!(unique_name(&mut taken, 0, "a.jpg", "s1"), "a.jpg");
        assert_eq!(unique_name(&mut taken, 0, "a.jpg", "s2"), "s2_a.jpg");
        assert_eq!(unique_name(&mut taken, 0, "a.jpg", "s2"), "s2_1_a.jpg");
        assert_eq!(
            unique_name(&mut taken, 1, "a.jpg", "s2"),
            "a.jpg",
            "another dir"
        );
    }

    #[test]
    fn a_sample_failing_its_stored_crc_is_refused_naming_it() {
        let scan = Scan {
            format: crate::formats::Format::Zip,
            objects: vec!["/data/a.zip".into()],
            chunks: Vec::new(),
            samples: Vec::new(),
            fields: Vec::new(),
            compression: String::new(),
            labels: String::new(),
            derived: Vec::new(),
        };
        let s = Sample {
            name: "x.jpg".into(),
            crc32: Some(crc32fast::hash(b"right")),
            ..Sample::default()
        };
        let check = |pieces: &[&[u8]]| {
            let mut p = Probe::default();
            pieces.iter().for_each(|b| p.update(b));
            p.finish(&scan, &s)
        };
        assert!(check(&[b"ri", b"", b"ght"]).is_ok());
        let e = check(&[b"wrong"]).unwrap_err().to_string();
        assert!(e.contains("/data/a.zip: x.jpg fails its CRC-32"), "{e}");
    }
}
