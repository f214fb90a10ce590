//! TFRecord files of `tf.train.Example` records (uncompressed; `formats.md` §7, TensorFlow's
//! "TFRecords format details"): `u64 len | u32 masked CRC-32C(len) | data | u32 masked
//! CRC-32C(data)`, both CRCs checked while scanning. The image is the first value of the
//! `image/encoded` bytes feature, served in place; its offset comes from walking the protobuf
//! wire format, which a generated-code crate (prost) would not give, hence the project's own
//! ~80-line walker. Labels: `image/class/label` as stored (ImageNet's are 1-based);
//! class names from `image/class/synset` (else `image/class/text`); file names from
//! `image/filename` (else the record number).

use super::{Format, Sample, Scan, list_dir, mtime_of, read_at, sniff_ext};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

fn masked(crc: u32) -> u32 {
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn files(src: &Path) -> Result<Vec<PathBuf>> {
    if let Some(v) = super::brace_files(src) {
        return v;
    }
    if src.is_dir() {
        let v = list_dir(src, |n| !n.starts_with('.') && !n.ends_with(".json"))?;
        let v: Vec<PathBuf> = v
            .into_iter()
            .filter(|p| first_record_ok(p).is_ok())
            .collect();
        if v.is_empty() {
            bail!("no TFRecord files in {}", src.display());
        }
        Ok(v)
    } else {
        Ok(vec![src.to_path_buf()])
    }
}

fn first_record_ok(p: &Path) -> std::result::Result<(), String> {
    let h = read_at(p, 0, 12).map_err(|e| e.to_string())?;
    if h.len() < 12 {
        return Err(format!("{} is shorter than a record header", p.display()));
    }
    let crc = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    if masked(crc32c::crc32c(&h[..8])) == crc {
        Ok(())
    } else {
        Err(format!(
            "{} does not start with a TFRecord header",
            p.display()
        ))
    }
}

/// Ok when `src` (or the first file of a directory) starts with a TFRecord header whose
/// length CRC matches.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    if src.is_dir() || !src.exists() {
        let f = files(src).map_err(|e| e.to_string())?;
        first_record_ok(&f[0])
    } else {
        first_record_ok(src)
    }
}

/// A protobuf field: number, and either a varint or a byte range of the message.
enum Val {
    Varint(u64),
    Bytes(std::ops::Range<usize>),
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of the message `b[r]`, in order; `None` when it does not parse.
fn fields(b: &[u8], r: std::ops::Range<usize>) -> Option<Vec<(u64, Val)>> {
    let mut out = Vec::new();
    let mut at = r.start;
    while at < r.end {
        let tag = varint(b, &mut at)?;
        let v = match tag & 7 {
            0 => Val::Varint(varint(b, &mut at)?),
            1 => {
                at += 8;
                continue;
            }
            2 => {
                let n = varint(b, &mut at)? as usize;
                let e = at.checked_add(n).filter(|&e| e <= r.end)?;
                let v = Val::Bytes(at..e);
                at = e;
                v
            }
            5 => {
                at += 4;
                continue;
            }
            _ => return None,
        };
        out.push((tag >> 3, v));
    }
    (at == r.end).then_some(out)
}

/// One Example's features of interest: (name → first bytes value range, or int64 value).
fn example(b: &[u8]) -> Option<Vec<(String, Val)>> {
    let mut out = Vec::new();
    for (n, v) in fields(b, 0..b.len())? {
        let (1, Val::Bytes(features)) = (n, v) else {
            continue;
        };
        for (n, v) in fields(b, features)? {
            let (1, Val::Bytes(entry)) = (n, v) else {
                continue;
            };
            let mut key = None;
            let mut feat = None;
            for (n, v) in fields(b, entry)? {
                match (n, v) {
                    (1, Val::Bytes(k)) => key = Some(String::from_utf8_lossy(&b[k]).into_owned()),
                    (2, Val::Bytes(f)) => feat = Some(f),
                    _ => {}
                }
            }
            let (Some(key), Some(feat)) = (key, feat) else {
                continue;
            };
            for (n, v) in fields(b, feat)? {
                match (n, v) {
                    (1, Val::Bytes(list)) => {
                        if let Some((_, Val::Bytes(first))) =
                            fields(b, list)?.into_iter().find(|(n, _)| *n == 1)
                        {
                            out.push((key.clone(), Val::Bytes(first)));
                        }
                    }
                    (3, Val::Bytes(list)) => {
                        for (n, v) in fields(b, list.clone())? {
                            match (n, v) {
                                (1, Val::Varint(x)) => {
                                    out.push((key.clone(), Val::Varint(x)));
                                    break;
                                }
                                (1, Val::Bytes(packed)) => {
                                    let mut at = packed.start;
                                    if let Some(x) = varint(b, &mut at) {
                                        out.push((key.clone(), Val::Varint(x)));
                                    }
                                    break;
                                }
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Some(out)
}

/// Reads every record once (CRC-32C checked) and walks its Example.
pub fn scan(src: &Path, label_feature: Option<&str>) -> Result<Scan> {
    let label_feature = label_feature.unwrap_or("image/class/label");
    let objects = files(src)?;
    let mut samples = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let mut n = 0u64;
    for (k, p) in objects.iter().enumerate() {
        let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
        // SAFETY: a read-only map of a dataset file; if it is truncated while scanned, the
        // scan faults (the documented contract of mounting files that must not change).
        let data = unsafe { memmap2::Mmap::map(&f) }
            .with_context(|| format!("cannot map {}", p.display()))?;
        let mtime = mtime_of(p);
        let mut at = 0usize;
        while at < data.len() {
            let bad = |why: &str| anyhow::anyhow!("{}: record at byte {at}: {why}", p.display());
            let h = data
                .get(at..at.saturating_add(12))
                .ok_or_else(|| bad("truncated header"))?;
            let len = u64::from_le_bytes(h[..8].try_into()?) as usize;
            if masked(crc32c::crc32c(&h[..8])) != u32::from_le_bytes(h[8..12].try_into()?) {
                return Err(bad("length CRC-32C mismatch"));
            }
            let start = at + 12;
            let end = start
                .checked_add(len)
                .filter(|&e| e.checked_add(4).is_some_and(|x| x <= data.len()));
            let end = end.ok_or_else(|| bad("truncated record (the file ends inside it)"))?;
            let body = &data[start..end];
            let crc = u32::from_le_bytes(data[end..end + 4].try_into()?);
            if masked(crc32c::crc32c(body)) != crc {
                return Err(bad("data CRC-32C mismatch"));
            }
            let feats = example(body).ok_or_else(|| bad("not a tf.train.Example"))?;
            for (f, _) in &feats {
                names.insert(f.clone());
            }
            let bytes = |name: &str| {
                feats.iter().find_map(|(f, v)| match v {
                    Val::Bytes(r) if f == name => Some(r.clone()),
                    _ => None,
                })
            };
            let int = |name: &str| {
                feats.iter().find_map(|(f, v)| match v {
                    Val::Varint(x) if f == name => Some(*x as i64),
                    _ => None,
                })
            };
            let text =
                |name: &str| bytes(name).map(|r| String::from_utf8_lossy(&body[r]).into_owned());
            let Some(img) = bytes("image/encoded") else {
                return Err(bad("no image/encoded feature"));
            };
            let ext = sniff_ext(&body[img.clone()]);
            let name = match text("image/filename") {
                Some(f) if !f.is_empty() => {
                    let base = f.rsplit('/').next().unwrap_or(&f).to_string();
                    if base.contains('.') {
                        base
                    } else {
                        format!("{base}.{ext}")
                    }
                }
                _ => format!("{n:08}.{ext}"),
            };
            samples.push(Sample {
                object: k as u32,
                extra: extra_fields(&feats, start as u64),
                range: (start + img.start) as u64..(start + img.end) as u64,
                // Checked with the record's CRC-32C: a lazy index knows it without a re-read.
                crc32: Some(crc32fast::hash(&body[img.clone()])),
                label: int(label_feature),
                class: text("image/class/synset").or_else(|| text("image/class/text")),
                name,
                mtime,
                ..Sample::default()
            });
            n += 1;
            at = end + 4;
        }
    }
    Ok(Scan {
        format: Format::Tfrecord,
        derived: Vec::new(),
        objects,
        chunks: Vec::new(),
        samples,
        fields: names.into_iter().collect(),
        compression: "none".into(),
        labels: "image/class/label as stored (1-based for ImageNet: directory 0001 or the synset of label 1 is ImageFolder class 0); names from image/class/synset".into(),
    })
}

/// The bytes features of an Example other than the image, as byte ranges of the file (the
/// record's body starts at `start`).
fn extra_fields(feats: &[(String, Val)], start: u64) -> Vec<(String, std::ops::Range<u64>)> {
    feats
        .iter()
        .filter_map(|(f, v)| match v {
            Val::Bytes(r) if f != "image/encoded" => {
                Some((f.clone(), start + r.start as u64..start + r.end as u64))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut x: u64) -> Vec<u8> {
        let mut v = Vec::new();
        loop {
            let b = (x & 0x7f) as u8;
            x >>= 7;
            if x == 0 {
                v.push(b);
                return v;
            }
            v.push(b | 0x80);
        }
    }

    /// A protobuf length-delimited field.
    fn field(num: u64, body: &[u8]) -> Vec<u8> {
        [
            varint((num << 3) | 2),
            varint(body.len() as u64),
            body.to_vec(),
        ]
        .concat()
    }

    /// A `tf.train.Example` with `image/encoded` = `image` and `image/class/label` = `label`.
    fn example(image: &[u8], label: u64) -> Vec<u8> {
        let bytes_list = field(1, &field(1, image));
        let int64_list = field(3, &field(1, &varint(label)));
        let entry =
            |k: &str, f: Vec<u8>| field(1, &[field(1, k.as_bytes()), field(2, &f)].concat());
        let features = [
            entry("image/encoded", bytes_list),
            entry("image/class/label", int64_list),
        ]
        .concat();
        field(1, &features)
    }

    fn record(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        let mut r = len.to_vec();
        r.extend_from_slice(&masked(crc32c::crc32c(&len)).to_le_bytes());
        r.extend_from_slice(data);
        r.extend_from_slice(&masked(crc32c::crc32c(data)).to_le_bytes());
        r
    }

    fn file(records: &[Vec<u8>]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("train-00000");
        std::fs::write(&p, records.concat()).unwrap();
        (d, p)
    }

    #[test]
    fn images_are_found_in_place_with_their_labels() {
        let jpeg = b"\xff\xd8\xff\xe0 fake jpeg \xff\xd9".to_vec();
        let recs = [
            record(&example(&jpeg, 7)),
            record(&example(b"\xff\xd8two", 300)),
        ];
        let (_d, p) = file(&recs);
        let s = scan(&p, None).unwrap();
        assert_eq!(s.samples.len(), 2);
        let bytes = std::fs::read(&p).unwrap();
        let r = &s.samples[0].range;
        assert_eq!(&bytes[r.start as usize..r.end as usize], &jpeg[..]);
        assert_eq!(s.samples[0].label, Some(7));
        assert_eq!(s.samples[1].label, Some(300));
    }

    #[test]
    fn damaged_records_are_refused_with_the_offset() {
        let good = record(&example(b"\xff\xd8img", 1));
        // Truncated inside the record.
        let (_d, p) = file(&[good[..good.len() - 3].to_vec()]);
        let e = scan(&p, None).unwrap_err().to_string();
        assert!(
            e.contains("record at byte 0") && e.contains("truncated"),
            "{e}"
        );
        // A flipped data byte: the data CRC.
        let mut bad = good.clone();
        bad[20] ^= 1;
        let (_d, p) = file(&[good.clone(), bad]);
        let e = scan(&p, None).unwrap_err().to_string();
        assert!(e.contains(&format!("record at byte {}", good.len())), "{e}");
    }

    #[test]
    fn a_length_near_2_64_with_a_valid_length_crc_is_refused_not_a_panic() {
        // 12 + len within 4 of 2^64: `end + 4` overflowed before it was checked.
        for len in [u64::MAX, u64::MAX - 13, u64::MAX - 15, 1 << 62] {
            let l = len.to_le_bytes();
            let mut r = l.to_vec();
            r.extend_from_slice(&masked(crc32c::crc32c(&l)).to_le_bytes());
            r.extend_from_slice(&[0u8; 64]);
            let (_d, p) = file(&[r]);
            let e = scan(&p, None).unwrap_err().to_string();
            assert!(e.contains("truncated record"), "{len}: {e}");
        }
    }
}
