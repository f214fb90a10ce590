//! `loosefs verify` and `loosefs info`: whole-pack checks and a summary.
//!
//! Verify recomputes every sample's CRC-32 in parallel (rayon) and, given the source tree,
//! compares every byte and the set of files in both directions. Each problem is reported with
//! the sample's path.

use crate::format::index::Totals;
use crate::format::reader::Pack;
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
    problems.sort();
    Ok(problems)
}

/// Summary printed by `loosefs info`.
#[derive(Debug, serde::Serialize)]
pub struct Info {
    pub pack: String,
    pub pack_bytes: u64,
    pub index_version: u32,
    pub samples: u64,
    pub directories: u64,
    pub sample_bytes: u64,
    pub alignment: u32,
    pub jpeg_files: u64,
    pub other_files: u64,
}

/// Builds the summary from the index header (O(1)).
pub fn info(pack: &Pack) -> Info {
    let t: Totals = pack.totals();
    Info {
        pack: pack.path().display().to_string(),
        pack_bytes: pack.file_len(),
        index_version: crate::format::index::INDEX_VERSION,
        samples: t.files,
        directories: t.dirs,
        sample_bytes: t.bytes,
        alignment: t.align,
        jpeg_files: t.jpegs,
        other_files: t.files - t.jpegs,
    }
}
