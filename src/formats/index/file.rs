//! The kept index file of a foreign source: `LOOSEFSX`, a version, the JSON header (the
//! source's files with their sizes and mtimes, the scan options) and a loosefs index, written
//! to a temp file and renamed, read back by a map and checked before use.

use super::{Foreign, Header, MAGIC, VERSION};
use crate::pack::index::IndexView;
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use std::path::Path;
use std::sync::Arc;

pub(super) fn write(path: &Path, header: &Header, index: &[u8]) -> Result<()> {
    let json = serde_json::to_vec(header)?;
    let mut out = Vec::with_capacity(24 + json.len() + 8 + index.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize(out.len().div_ceil(8) * 8, 0);
    out.extend_from_slice(index);
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, &out)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Loads a kept index file. Errors: missing, not an index file, or its index fails its checks.
pub fn load(path: &Path) -> Result<Foreign> {
    let file = std::fs::File::open(path)?;
    // SAFETY: index files are written to a temporary name and renamed into place, never
    // modified after; the map is read-only.
    let map = unsafe { Mmap::map(&file)? };
    if map.len() < 24 || &map[..8] != MAGIC {
        bail!("{} is not a loosefs index file", path.display());
    }
    let version = u32::from_le_bytes(map[8..12].try_into()?);
    if version != VERSION {
        bail!("{}: index file version {version}", path.display());
    }
    let jlen = u64::from_le_bytes(map[16..24].try_into()?) as usize;
    let jend = 24usize
        .checked_add(jlen)
        .filter(|&e| e <= map.len())
        .context("truncated index file")?;
    let header: Header = serde_json::from_slice(&map[24..jend])?;
    let start = jend.div_ceil(8) * 8;
    let index = start..map.len();
    {
        let v = IndexView::parse(map.get(index.clone()).context("truncated index file")?)?;
        v.validate_tree()?;
        let total: u64 = header.objects.iter().map(|o| o.served_len()).sum();
        if v.totals().data_end > total || header.bases.len() != header.objects.len() {
            bail!(
                "{}: the index does not match its object table",
                path.display()
            );
        }
    }
    Ok(Foreign {
        header,
        path: path.to_path_buf(),
        built: false,
        map: Arc::new(map),
        index,
    })
}
