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

/// Bytes at the start of an FFCV file that hold its header and field descriptors whatever
/// their number (at most 255, as [`sniff`] accepts): what [`table_ranges`] needs first.
pub const HEAD_MAX: usize = 24 + 255 * FIELD_LEN;

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

/// The 24-byte file header: field count, sample count, allocation table offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    fields: usize,
    samples: u64,
    alloc_table: u64,
}

/// Reads the header of `map`. Errors: truncation, another version, an unfinished file.
fn header(map: &[u8]) -> Result<Header, String> {
    let mut le = Le::new(map, 0);
    let (Some(version), Some(nf), Some(_page), Some(n), Some(alloc)) =
        (le.u16(), le.u16(), le.u32(), le.u64(), le.u64())
    else {
        return Err("truncated header".into());
    };
    if version != 2 {
        return Err(format!("FFCV version {version}; loosefs reads version 2"));
    }
    if alloc == 0 {
        return Err("the allocation table pointer is 0: the writer did not finish".into());
    }
    Ok(Header {
        fields: usize::from(nf),
        samples: n,
        alloc_table: alloc,
    })
}

/// The fields and the metadata table's row layout: (type id, name) per field, each field's
/// offset in a row, and the row length (numpy `align=True`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    fields: Vec<(u8, String)>,
    offsets: Vec<usize>,
    row_len: usize,
}

/// Reads `nf` field descriptors after the header. Errors: truncation, a custom field type.
fn layout(map: &[u8], nf: usize) -> Result<Layout, String> {
    let (mut fields, mut offsets) = (Vec::new(), Vec::new());
    let (mut row, mut max_align) = (0usize, 1);
    for i in 0..nf {
        let d = map
            .get(24 + i * FIELD_LEN..24 + (i + 1) * FIELD_LEN)
            .ok_or("truncated field descriptors")?;
        let name: String = d[1..17]
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as char)
            .collect();
        let (size, align) = meta_layout(d[0])
            .ok_or_else(|| format!("field {name} has type {} (custom): not readable", d[0]))?;
        row = row.div_ceil(align) * align;
        offsets.push(row);
        row += size;
        max_align = max_align.max(align);
        fields.push((d[0], name));
    }
    Ok(Layout {
        fields,
        offsets,
        row_len: row.div_ceil(max_align) * max_align,
    })
}

/// The allocation table at `at` to the end of `map`: each allocation's size by its pointer.
/// Allocations that run past the end of the file are left out (a sample using one is refused).
fn allocations(map: &[u8], at: u64) -> Result<HashMap<u64, u64>, String> {
    let table = usize::try_from(at)
        .ok()
        .and_then(|a| map.get(a..))
        .ok_or("the allocation table lies past the end")?;
    let len = map.len() as u64;
    Ok(table
        .chunks_exact(24)
        .filter_map(|t| {
            let mut le = Le::new(t, 8);
            let (ptr, size) = (le.u64()?, le.u64()?);
            (ptr.checked_add(size)? <= len).then_some((ptr, size))
        })
        .collect())
}

/// Sample `i` from its metadata row `row`: its image's range (checked against the allocation
/// table), mode (jpg or raw RGB) and label.
fn parse_sample(
    row: &[u8],
    layout: &Layout,
    image: usize,
    label: Option<usize>,
    sizes: &HashMap<u64, u64>,
    i: u64,
) -> Result<Sample, String> {
    let mut le = Le::new(row, layout.offsets[image]);
    let (Some(&[mode]), Some(width), Some(height), Some(ptr)) =
        (le.bytes(1), le.u16(), le.u16(), le.u64())
    else {
        return Err(format!("sample {i}: truncated image metadata"));
    };
    if mode > 1 {
        return Err(format!(
            "sample {i}: image mode {mode} (0 jpg and 1 raw are known)"
        ));
    }
    let size = *sizes
        .get(&ptr)
        .ok_or_else(|| format!("sample {i}: its image at {ptr} is not in the allocation table"))?;
    let pixels = (mode == 1).then_some((u32::from(width), u32::from(height)));
    if let Some((w, h)) = pixels {
        let need = u64::from(w) * u64::from(h) * 3;
        if need != size {
            return Err(format!(
                "sample {i}: raw image {w}x{h} needs {need} bytes, its allocation has {size}"
            ));
        }
    }
    let label = label.and_then(|c| Le::new(row, layout.offsets[c]).u64().map(|v| v as i64));
    Ok(Sample {
        range: ptr..ptr + size,
        label,
        pixels,
        ..Sample::default()
    })
}

/// The byte ranges of an FFCV file of `len` bytes that [`scan`] reads, found from its first
/// bytes `head` (at least the header and field descriptors, `24 + 1041 × fields` bytes): the
/// header, descriptors and metadata table from the start, and the allocation table to the end.
/// What a dataset at a URL fetches to be indexed without its samples. Errors: as [`scan`]'s.
pub fn table_ranges(head: &[u8], len: u64) -> Result<Vec<std::ops::Range<u64>>, String> {
    let h = header(head)?;
    let l = layout(head, h.fields)?;
    let meta = (24 + h.fields * FIELD_LEN) as u64;
    let end = (h.samples.checked_mul(l.row_len as u64))
        .and_then(|t| t.checked_add(meta))
        .filter(|&e| e <= len)
        .ok_or("the metadata table runs past the end")?;
    if h.alloc_table > len {
        return Err("the allocation table lies past the end".into());
    }
    Ok(vec![0..end, h.alloc_table..len])
}

/// The name `info` shows for a field type id.
fn type_name(t: u8) -> &'static str {
    match t {
        0 => "float",
        1 => "int",
        2 => "rgb_image",
        3 => "bytes",
        4 => "ndarray",
        5 => "json",
        _ => "tensor",
    }
}

/// Reads the header, field descriptors, metadata table and allocation table.
pub fn scan(src: &Path) -> Result<Scan> {
    let f = std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    // SAFETY: a read-only map of a dataset file that must not change while indexed.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let bad = |why: String| anyhow::anyhow!("{}: {why}", src.display());
    let h = header(&map).map_err(bad)?;
    let layout = layout(&map, h.fields).map_err(bad)?;
    let meta = 24 + h.fields * FIELD_LEN;
    let n = usize::try_from(h.samples)
        .ok()
        .filter(|&n| {
            n.checked_mul(layout.row_len)
                .and_then(|l| l.checked_add(meta))
                .is_some_and(|e| e <= map.len())
        })
        .ok_or_else(|| {
            bad(format!(
                "the metadata table of {} samples runs past the end",
                h.samples
            ))
        })?;
    let image = (layout.fields.iter().position(|(t, _)| *t == 2))
        .ok_or_else(|| bad("no RGBImageField".into()))?;
    let label = layout.fields.iter().position(|(t, _)| *t == 1);
    let sizes = allocations(&map, h.alloc_table).map_err(bad)?;
    let mtime = mtime_of(src);
    let digits = n.max(1).to_string().len().max(8);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let row = &map[meta + i * layout.row_len..meta + (i + 1) * layout.row_len];
        let s = parse_sample(row, &layout, image, label, &sizes, i as u64).map_err(bad)?;
        let ext = if s.pixels.is_some() { "ppm" } else { "jpg" };
        let name = format!("{i:0digits$}.{ext}");
        samples.push(Sample { name, mtime, ..s });
    }
    Ok(Scan {
        format: Format::Ffcv,
        derived: Vec::new(),
        objects: vec![src.to_path_buf()],
        chunks: Vec::new(),
        samples,
        fields: (layout.fields.iter())
            .map(|(t, n)| format!("{n}:{}", type_name(*t)))
            .collect(),
        compression:
            "none (images as FFCV wrote them: re-encoded JPEG, or raw RGB behind a PPM header)"
                .into(),
        labels: "the IntField as stored, as zero-padded directory names (FFCV has no class names)"
            .into(),
    })
}

#[cfg(test)]
mod tests;
