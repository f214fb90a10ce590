//! FFCV `.beton` files (`formats.md` §1, ffcv `types.py`, `writer.py`, `fields/`): a 24-byte
//! header (`u16 version = 2 | u16 fields | u32 page_size | u64 samples | u64 alloc_table_ptr`),
//! 1041-byte field descriptors, a metadata table of numpy `align=True` rows, pages of data,
//! and an allocation table `(u64 sample, u64 ptr, u64 size)` to the end of the file. JPEG
//! images (`RGBImageField` mode 0) are served in place from `[data_ptr, data_ptr + size)`;
//! labels are the first `IntField` (FFCV has no class names: directories are zero-padded
//! labels). Raw-pixel images (mode 1: `height`×`width`×3 RGB bytes, row-major) are served in
//! place behind a PPM header (`<n>.ppm`; `.npy` beside it with `--decode npy`), so mixed
//! `proportion`/`smart` files work too.

use super::{Format, Le, Sample, Scan, mtime_of};
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::Path;

const FIELD_LEN: usize = 1041;

/// Ok when `src` is a file whose header reads as FFCV version 2.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    if !src.is_file() {
        return Err(format!("{} is not a file", src.display()));
    }
    let h = super::read_at(src, 0, 24).map_err(|e| e.to_string())?;
    let mut le = Le::new(&h, 0);
    let (Some(v), Some(nf), Some(ps)) = (le.u16(), le.u16(), le.u32()) else {
        return Err("shorter than an FFCV header".into());
    };
    if v == 2 && nf > 0 && nf < 256 && ps.is_power_of_two() && ps >= 1 << 16 {
        Ok(())
    } else {
        Err("no FFCV version-2 header".into())
    }
}

/// (size, alignment) of a field's metadata by type id.
fn meta_layout(type_id: u8) -> Option<(usize, usize)> {
    Some(match type_id {
        0 | 1 | 4 | 6 => (8, 8),
        2 => (13, 1),
        3 | 5 => (16, 1),
        _ => return None,
    })
}

/// Reads the header, field descriptors, metadata table and allocation table.
pub fn scan(src: &Path) -> Result<Scan> {
    let f = std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    // SAFETY: a read-only map of a dataset file that must not change while indexed.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let bad = |why: String| anyhow::anyhow!("{}: {why}", src.display());
    let mut le = Le::new(&map, 0);
    let (version, nf, _page) = (
        le.u16().ok_or_else(|| bad("truncated header".into()))?,
        le.u16().ok_or_else(|| bad("truncated header".into()))? as usize,
        le.u32().ok_or_else(|| bad("truncated header".into()))?,
    );
    let n = le.u64().ok_or_else(|| bad("truncated header".into()))? as usize;
    let alloc = le.u64().ok_or_else(|| bad("truncated header".into()))? as usize;
    if version != 2 {
        return Err(bad(format!(
            "FFCV version {version}; loosefs reads version 2"
        )));
    }
    if alloc == 0 {
        return Err(bad(
            "the allocation table pointer is 0: the writer did not finish".into(),
        ));
    }
    let mut fields = Vec::new();
    let mut offs = Vec::new();
    let mut row = 0usize;
    let mut max_align = 1;
    for i in 0..nf {
        let d = map
            .get(24 + i * FIELD_LEN..24 + (i + 1) * FIELD_LEN)
            .ok_or_else(|| bad("truncated field descriptors".into()))?;
        let name: String = d[1..17]
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as char)
            .collect();
        let (size, align) = meta_layout(d[0]).ok_or_else(|| {
            bad(format!(
                "field {name} has type {} (custom): not readable",
                d[0]
            ))
        })?;
        row = row.div_ceil(align) * align;
        offs.push(row);
        row += size;
        max_align = max_align.max(align);
        fields.push((d[0], name));
    }
    let row_len = row.div_ceil(max_align) * max_align;
    let meta = 24 + nf * FIELD_LEN;
    if meta
        .checked_add(n.saturating_mul(row_len))
        .is_none_or(|e| e > map.len())
    {
        return Err(bad(format!(
            "the metadata table of {n} samples runs past the end"
        )));
    }
    let image = fields
        .iter()
        .position(|(t, _)| *t == 2)
        .ok_or_else(|| bad("no RGBImageField".into()))?;
    let label = fields.iter().position(|(t, _)| *t == 1);
    let table = map
        .get(alloc..)
        .ok_or_else(|| bad("the allocation table lies past the end".into()))?;
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    for t in table.chunks_exact(24) {
        let ptr = u64::from_le_bytes(t[8..16].try_into()?);
        let size = u64::from_le_bytes(t[16..24].try_into()?);
        sizes.insert(ptr, size);
    }
    let mtime = mtime_of(src);
    let digits = n.max(1).to_string().len().max(8);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let r = &map[meta + i * row_len..meta + (i + 1) * row_len];
        let im = &r[offs[image]..offs[image] + 13];
        let mode = im[0];
        let width = u16::from_le_bytes(im[1..3].try_into()?);
        let height = u16::from_le_bytes(im[3..5].try_into()?);
        let ptr = u64::from_le_bytes(im[5..13].try_into()?);
        if mode > 1 {
            return Err(bad(format!(
                "sample {i}: image mode {mode} (0 jpg and 1 raw are known)"
            )));
        }
        let size = *sizes.get(&ptr).ok_or_else(|| {
            bad(format!(
                "sample {i}: its image at {ptr} is not in the allocation table"
            ))
        })?;
        let label = label
            .map(|c| i64::from_le_bytes(r[offs[c]..offs[c] + 8].try_into().unwrap_or_default()));
        let pixels = (mode == 1).then_some((u32::from(width), u32::from(height)));
        if let Some((w, h)) = pixels {
            if u64::from(w) * u64::from(h) * 3 != size {
                return Err(bad(format!(
                    "sample {i}: raw image {w}x{h} needs {} bytes, its allocation has {size}",
                    u64::from(w) * u64::from(h) * 3
                )));
            }
        }
        samples.push(Sample {
            object: 0,
            range: ptr..ptr + size,
            label,
            pixels,
            name: format!("{i:0digits$}.{}", if mode == 1 { "ppm" } else { "jpg" }),
            mtime,
            ..Sample::default()
        });
    }
    Ok(Scan {
        format: Format::Ffcv,
        derived: Vec::new(),
        objects: vec![src.to_path_buf()],
        chunks: Vec::new(),
        samples,
        fields: fields
            .iter()
            .map(|(t, n)| {
                format!(
                    "{n}:{}",
                    match t {
                        0 => "float",
                        1 => "int",
                        2 => "rgb_image",
                        3 => "bytes",
                        4 => "ndarray",
                        5 => "json",
                        _ => "tensor",
                    }
                )
            })
            .collect(),
        compression:
            "none (images as FFCV wrote them: re-encoded JPEG, or raw RGB behind a PPM header)"
                .into(),
        labels: "the IntField as stored, as zero-padded directory names (FFCV has no class names)"
            .into(),
    })
}
