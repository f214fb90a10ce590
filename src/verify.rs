//! `loosefs verify` and `loosefs info`: whole-pack checks and a summary.
//!
//! Verify recomputes every sample's CRC-32 in parallel (rayon) and, given the source tree,
//! compares every byte and the set of files in both directions. It also checks the zip layer
//! that other tools read: the central directory parses (the `zip` crate), and every member's
//! local header has its signature, name, method, sizes and CRC-32 as the central directory
//! says, with data exactly where the index says. Each problem is reported with the path.

use crate::pack::index::Totals;
use crate::pack::reader::Pack;
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::collections::BTreeSet;
use std::path::Path;

/// Every file record of the pack as (path relative to the root, record number), in pack order
/// (depth first, names sorted).
pub fn file_paths(pack: &Pack) -> Vec<(String, u32)> {
    let ix = pack.index();
    let mut out = Vec::with_capacity(ix.totals().files as usize);
    let Some(root) = ix.record(0) else { return out };
    // Depth first with each directory's children in name order: a stack of child ranges.
    let mut stack = vec![(String::new(), ix.children(&root))];
    while let Some((prefix, range)) = stack.last_mut() {
        let Some(i) = range.next() else {
            stack.pop();
            continue;
        };
        let Some(r) = ix.record(i) else { continue };
        let name = String::from_utf8_lossy(ix.name(&r));
        let path = if prefix.is_empty() {
            name.into_owned()
        } else {
            format!("{prefix}/{name}")
        };
        if r.is_dir {
            stack.push((path, ix.children(&r)));
        } else {
            out.push((path, i));
        }
    }
    out
}

/// Checks the pack; returns one line per problem (empty when the pack is sound).
pub fn verify(pack: &Pack, against: Option<&Path>) -> Result<Vec<String>> {
    let ix = pack.index();
    let files = file_paths(pack);
    let mut problems: Vec<String> = files
        .par_iter()
        .filter_map(|(path, i)| {
            let r = ix.record(*i)?;
            let Some(data) = pack.data(&r) else {
                return Some(format!(
                    "{path}: data range {}+{} lies outside the pack",
                    r.data_off, r.size
                ));
            };
            let crc = crc32fast::hash(data);
            if crc != r.crc32 {
                return Some(format!(
                    "{path}: CRC-32 {crc:08x} does not match the index ({:08x})",
                    r.crc32
                ));
            }
            let src = against?.join(path);
            match std::fs::read(&src) {
                Ok(bytes) if bytes == data => None,
                Ok(bytes) => Some(format!(
                    "{path}: differs from {} ({} bytes in the pack, {} in the source)",
                    src.display(),
                    data.len(),
                    bytes.len()
                )),
                Err(e) => Some(format!("{path}: cannot read {}: {e}", src.display())),
            }
        })
        .collect();
    if let Some(src) = against {
        let in_pack: BTreeSet<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        for e in walkdir::WalkDir::new(src).min_depth(1) {
            let e = e.with_context(|| format!("cannot walk {}", src.display()))?;
            if !e.file_type().is_file() {
                continue;
            }
            let rel = e.path().strip_prefix(src)?.to_string_lossy().into_owned();
            if !in_pack.contains(rel.as_str()) {
                problems.push(format!(
                    "{rel}: in {} but missing from the pack",
                    src.display()
                ));
            }
        }
    }
    problems.extend(verify_zip(pack, &files));
    problems.sort();
    Ok(problems)
}

/// Problems of the zip layer (see the module doc), one line each.
fn verify_zip(pack: &Pack, files: &[(String, u32)]) -> Vec<String> {
    let ix = pack.index();
    let mut problems = Vec::new();
    let file = match std::fs::File::open(pack.path()) {
        Ok(f) => f,
        Err(e) => return vec![format!("zip: cannot open {}: {e}", pack.path().display())],
    };
    let mut archive = match zip::ZipArchive::new(file) {
        Ok(a) => a,
        Err(e) => return vec![format!("zip: the central directory does not parse: {e}")],
    };
    let map = pack.map();
    let mut central = std::collections::HashMap::new();
    for k in 0..archive.len() {
        let m = match archive.by_index_raw(k) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("zip: member {k}: {e}"));
                continue;
            }
        };
        let name = String::from_utf8_lossy(m.name_raw()).into_owned();
        if let Err(why) = check_local_header(map, &m) {
            problems.push(format!(
                "{name}: local header at {}: {why}",
                m.header_start()
            ));
        }
        if !m.is_dir() {
            central.insert(name, (m.data_start(), m.size(), m.crc32(), m.compression()));
        }
    }
    for (path, i) in files {
        let Some(r) = ix.record(*i) else { continue };
        match central.remove(path) {
            None => problems.push(format!(
                "{path}: in the index but not in the zip central directory"
            )),
            Some((start, size, crc, method)) => {
                if method != zip::CompressionMethod::Stored {
                    problems.push(format!("{path}: zip member is {method:?}, not stored"));
                }
                if (start, size, crc) != (r.data_off, r.size, r.crc32) {
                    problems.push(format!(
                        "{path}: the zip says data at {start}, {size} bytes, CRC-32 {crc:08x}; the index says {}, {}, {:08x}",
                        r.data_off, r.size, r.crc32
                    ));
                }
            }
        }
    }
    central.remove(crate::pack::INDEX_MEMBER);
    for name in central.keys() {
        problems.push(format!(
            "{name}: in the zip central directory but not in the index"
        ));
    }
    problems
}

/// Checks a member's local file header against its central directory entry.
fn check_local_header<R: std::io::Read>(
    map: &[u8],
    m: &zip::read::ZipFile<'_, R>,
) -> Result<(), String> {
    let at = m.header_start() as usize;
    let h = map.get(at..at + 30).ok_or("past the end of the file")?;
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    if u32_at(0) != 0x0403_4b50 {
        return Err("bad signature".into());
    }
    let (name_len, extra_len) = (u16_at(26) as usize, u16_at(28) as usize);
    let name = map
        .get(at + 30..at + 30 + name_len)
        .ok_or("name past the end of the file")?;
    if name != m.name_raw() {
        return Err(format!(
            "name {:?} where the central directory says {:?}",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(m.name_raw())
        ));
    }
    let method = u16_at(8);
    let central_method: u16 = match m.compression() {
        zip::CompressionMethod::Stored => 0,
        _ => u16::MAX,
    };
    if central_method != u16::MAX && method != central_method {
        return Err(format!(
            "compression method {method} where the central directory says {central_method}"
        ));
    }
    let data_descriptor = u16_at(6) & 8 != 0;
    if !data_descriptor && u32_at(14) != m.crc32() {
        return Err(format!(
            "CRC-32 {:08x} where the central directory says {:08x}",
            u32_at(14),
            m.crc32()
        ));
    }
    let (csize, usize_) = (u32_at(18), u32_at(22));
    if !data_descriptor && csize != u32::MAX && u64::from(csize) != m.compressed_size() {
        return Err(format!(
            "compressed size {csize} where the central directory says {}",
            m.compressed_size()
        ));
    }
    if !data_descriptor && usize_ != u32::MAX && u64::from(usize_) != m.size() {
        return Err(format!(
            "size {usize_} where the central directory says {}",
            m.size()
        ));
    }
    let data_start = (at + 30 + name_len + extra_len) as u64;
    if data_start != m.data_start() {
        return Err(format!(
            "data at {data_start} where the zip reader found {}",
            m.data_start()
        ));
    }
    Ok(())
}

/// Summary printed by `loosefs info`.
#[derive(Debug, serde::Serialize)]
pub struct Info {
    /// The pack's path or URL.
    pub pack: String,
    /// Size of the pack file, bytes.
    pub pack_bytes: u64,
    /// The index version its trailer names.
    pub index_version: u32,
    /// Files in the pack.
    pub samples: u64,
    /// Directories in the pack (the root included).
    pub directories: u64,
    /// Sum of the files' sizes, bytes.
    pub sample_bytes: u64,
    /// Alignment of the files' data in the pack, bytes (as `pack --align` wrote it).
    pub alignment: u32,
    /// Files whose header probes as a JPEG.
    pub jpeg_files: u64,
    /// The other files.
    pub other_files: u64,
}

impl Info {
    /// The summary as `loosefs info` prints it, one `name: value` line each.
    pub fn text(&self) -> String {
        format!(
            "pack:          {} ({} bytes)\nindex version: {}\nsamples:       {} ({} JPEG, {} other)\ndirectories:   {} (root included)\nsample bytes:  {}\nalignment:     {} bytes\n",
            self.pack,
            self.pack_bytes,
            self.index_version,
            self.samples,
            self.jpeg_files,
            self.other_files,
            self.directories,
            self.sample_bytes,
            self.alignment
        )
    }
}

/// Builds the summary from the index header (O(1)).
pub fn info(pack: &Pack) -> Info {
    info_of(
        &pack.path().display().to_string(),
        pack.file_len(),
        pack.totals(),
    )
}

/// [`Info`] of a pack named `name` of `bytes` bytes whose index has totals `t` (a local or a
/// remote pack).
pub fn info_of(name: &str, bytes: u64, t: Totals) -> Info {
    Info {
        pack: name.to_string(),
        pack_bytes: bytes,
        index_version: crate::pack::index::INDEX_VERSION,
        samples: t.files,
        directories: t.dirs,
        sample_bytes: t.bytes,
        alignment: t.align,
        jpeg_files: t.jpegs,
        other_files: t.files - t.jpegs,
    }
}
