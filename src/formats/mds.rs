//! MosaicML Streaming (MDS) directories (`formats.md` §5, `streaming/base/format/mds`):
//! `index.json` lists shards with their columns; a shard is `u32 n | u32 offsets[n+1] |
//! config JSON | samples`, a sample being one u32 size per variable-size column, then the
//! columns' bytes in column order. The image is the first `jpeg`/`png` column, served in place
//! (or a `pil` RGB column: its pixels in place behind a PPM header);
//! the label the first integer column (`label` preferred), the class name the first `str`
//! column. zstd-compressed shards (`zip_data`, `compression: "zstd[:level]"`) are served through
//! the chunk cache (each shard a chunk of `raw_data.bytes` decompressed bytes); other codecs
//! (gz, bz2, br, snappy) are refused, naming the shard.

use super::{ChunkSpec, Format, Le, Sample, Scan, mtime_of};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::Path;

/// Ok when `src` is a directory whose `index.json` has a `shards` list.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    let j = std::fs::read(src.join("index.json")).map_err(|e| format!("no index.json ({e})"))?;
    let v: Value = serde_json::from_slice(&j).map_err(|e| format!("index.json: {e}"))?;
    if v.get("shards").is_some_and(Value::is_array) {
        Ok(())
    } else {
        Err("index.json has no shards list".into())
    }
}

fn fixed_size(enc: &str) -> Option<u64> {
    Some(match enc {
        "int" | "int64" | "uint64" | "float64" => 8,
        "int32" | "uint32" | "float32" => 4,
        "int16" | "uint16" | "float16" => 2,
        "int8" | "uint8" => 1,
        _ => return None,
    })
}

/// `index.json` as the MDS writer leaves it: only the fields loosefs reads.
#[derive(Debug, serde::Deserialize)]
struct IndexJson {
    shards: Vec<ShardMeta>,
}

/// One shard's entry in `index.json`.
#[derive(Debug, serde::Deserialize)]
struct ShardMeta {
    column_names: Vec<String>,
    column_encodings: Vec<String>,
    #[serde(default)]
    compression: Option<String>,
    raw_data: FileMeta,
    #[serde(default)]
    zip_data: Option<FileMeta>,
}

/// A shard file: its name in the directory and its length (decompressed, for `raw_data`).
#[derive(Debug, serde::Deserialize)]
struct FileMeta {
    basename: String,
    #[serde(default)]
    bytes: Option<u64>,
}

/// Where a shard's columns are and how they are read: sizes of fixed columns (None: a u32 size
/// precedes the bytes), the image column and whether it is `pil`, the label and class columns.
#[derive(Debug, Clone)]
struct Columns {
    names: Vec<String>,
    sizes: Vec<Option<u64>>,
    image: usize,
    pil: bool,
    ext: &'static str,
    label: Option<usize>,
    class: Option<usize>,
}

impl Columns {
    /// The layout of a shard's columns; `label_column` from `--label`. Errors name what is
    /// missing (the caller prefixes the index and shard).
    fn new(meta: &ShardMeta, label_column: Option<&str>) -> Result<Columns, String> {
        let (names, encs) = (&meta.column_names, &meta.column_encodings);
        if names.len() != encs.len() {
            return Err("column names and encodings differ in number".into());
        }
        let sizes: Vec<Option<u64>> = encs.iter().map(|e| fixed_size(e)).collect();
        let image = encs
            .iter()
            .position(|e| e == "jpeg" || e == "png" || e == "pil")
            .ok_or("no jpeg, png or pil column")?;
        let label = match label_column {
            Some(l) => Some(
                names
                    .iter()
                    .position(|n| n == l)
                    .filter(|&i| sizes[i] == Some(8))
                    .ok_or_else(|| format!("--label {l}: no 8-byte integer column of that name"))?,
            ),
            None => names
                .iter()
                .position(|n| n == "label")
                .filter(|&i| sizes[i] == Some(8))
                .or_else(|| encs.iter().position(|e| e == "int" || e == "int64")),
        };
        let ext = match encs[image].as_str() {
            "pil" => "ppm",
            "png" => "png",
            _ => "jpg",
        };
        Ok(Columns {
            names: names.clone(),
            sizes,
            image,
            pil: encs[image] == "pil",
            ext,
            label,
            class: encs.iter().position(|e| e == "str"),
        })
    }
}

/// The shard file a shard's entry names (its `zip_data` file when compressed) and whether it
/// is zstd. Errors: another codec, a missing name, a name that climbs out of the directory.
fn shard_file(meta: &ShardMeta) -> Result<(&str, bool), String> {
    let zstd = match meta.compression.as_deref() {
        None => false,
        Some(c) if c == "zstd" || c.starts_with("zstd:") => true,
        Some(c) => {
            return Err(format!(
                "shard {} is compressed with {c}: loosefs serves uncompressed and zstd MDS shards",
                meta.raw_data.basename
            ));
        }
    };
    let name = if zstd {
        &meta
            .zip_data
            .as_ref()
            .ok_or("a compressed shard without zip_data.basename")?
            .basename
    } else {
        &meta.raw_data.basename
    };
    if name.split('/').any(|c| c == "..") || name.starts_with('/') {
        return Err(format!("shard name {name:?} climbs out of the directory"));
    }
    Ok((name, zstd))
}

/// The sample stored at `item` of shard bytes `data` (object `object`, sample number
/// `global`): its image range (RGB pixels of a `pil` image, behind a PPM header when served),
/// label, class and other variable-size columns. Errors say which sample and what is wrong.
fn parse_sample(
    data: &[u8],
    item: std::ops::Range<usize>,
    cols: &Columns,
    i: usize,
) -> Result<Sample, String> {
    let mut r = Le::new(&data[..item.end], item.start);
    let lens = cols
        .sizes
        .iter()
        .map(|sz| sz.or_else(|| r.u32().map(u64::from)))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("sample {i}: truncated"))?;
    let ranges = super::consecutive(r.at as u64, &lens, item.end as u64)
        .ok_or_else(|| format!("sample {i}: its columns run past its end"))?;
    let field = |c: usize| &data[ranges[c].start as usize..ranges[c].end as usize];
    let (range, pixels) = if cols.pil {
        let (r, size) =
            pil_pixels(data, ranges[cols.image].clone()).map_err(|e| format!("sample {i}: {e}"))?;
        (r, Some(size))
    } else {
        (ranges[cols.image].clone(), None)
    };
    Ok(Sample {
        extra: (0..cols.names.len())
            .filter(|&c| c != cols.image && cols.sizes[c].is_none())
            .map(|c| (cols.names[c].clone(), ranges[c].clone()))
            .collect(),
        range,
        pixels,
        label: cols
            .label
            .map(|c| i64::from_le_bytes(field(c).try_into().unwrap_or_default())),
        class: cols
            .class
            .map(|c| String::from_utf8_lossy(field(c)).into_owned()),
        ..Sample::default()
    })
}

/// A `pil` column value at `r` of `data` (`u32 width | u32 height | u32 mode length | mode |
/// pixels`): the range of its RGB pixels and the image's size. Other modes are refused.
fn pil_pixels(
    data: &[u8],
    r: std::ops::Range<u64>,
) -> Result<(std::ops::Range<u64>, (u32, u32)), String> {
    let mut le = Le::new(&data[..r.end as usize], r.start as usize);
    let (Some(w), Some(h), Some(ml)) = (le.u32(), le.u32(), le.u32()) else {
        return Err("truncated pil header".into());
    };
    let mode = le.bytes(ml as usize).ok_or("truncated pil mode")?;
    if mode != b"RGB" {
        return Err(format!(
            "pil image in mode {}: loosefs serves RGB pil images (as PPM)",
            String::from_utf8_lossy(mode)
        ));
    }
    let start = le.at as u64;
    let need = u64::from(w) * u64::from(h) * 3;
    if r.end - start != need {
        return Err(format!(
            "{w}x{h} RGB needs {need} bytes, it has {}",
            r.end - start
        ));
    }
    Ok((start..r.end, (w, h)))
}

/// The bytes of one shard: mapped in place, or decompressed whole (its chunk spec).
type ShardBytes = (Box<dyn std::ops::Deref<Target = [u8]>>, Option<ChunkSpec>);

/// Maps shard `path`, or decompresses it when `zstd` (to `raw_len` bytes, bounded by
/// [`crate::storage::chunks::MAX_CHUNK`]).
fn shard_bytes(path: &Path, zstd: bool, raw_len: Option<u64>) -> Result<ShardBytes> {
    let f = std::fs::File::open(path)?;
    if !zstd {
        // SAFETY: a read-only map of a dataset file that must not change while indexed.
        return Ok((Box::new(unsafe { memmap2::Mmap::map(&f) }?), None));
    }
    let spec = ChunkSpec {
        codec: crate::storage::chunks::Codec::Zstd,
        offset: 0,
        stored_len: f.metadata()?.len(),
        len: raw_len.context("a compressed shard without raw_data.bytes")?,
        crc32: None,
        parquet: None,
    };
    let data = spec.open(path)?.decompress()?;
    Ok((Box::new(data), Some(spec)))
}

/// Reads `index.json` and every shard's offset table and column sizes.
pub fn scan(src: &Path, label_column: Option<&str>) -> Result<Scan> {
    let ipath = src.join("index.json");
    let index: IndexJson = serde_json::from_slice(&std::fs::read(&ipath)?)
        .with_context(|| format!("{}: not an MDS index", ipath.display()))?;
    let (mut objects, mut chunks, mut samples, mut fields) = (vec![], vec![], vec![], vec![]);
    for meta in &index.shards {
        let at = |e: String| anyhow::anyhow!("{}: {e}", ipath.display());
        let (basename, zstd) = shard_file(meta).map_err(at)?;
        let cols = Columns::new(meta, label_column).map_err(|e| at(format!("{basename}: {e}")))?;
        if fields.is_empty() {
            fields = (meta.column_names.iter().zip(&meta.column_encodings))
                .map(|(n, e)| format!("{n}:{e}"))
                .collect();
        }
        let path = src.join(basename);
        if !path.is_file() {
            bail!("{}: shard {basename} is missing", ipath.display());
        }
        let bad = |why: String| anyhow::anyhow!("{}: {why}", path.display());
        let (data, chunk) =
            shard_bytes(&path, zstd, meta.raw_data.bytes).map_err(|e| bad(format!("{e:#}")))?;
        let (k, mtime) = (objects.len() as u32, mtime_of(&path));
        for (i, item) in super::offset_table(&data)
            .map_err(bad)?
            .into_iter()
            .enumerate()
        {
            let s = parse_sample(&data, item, &cols, i).map_err(bad)?;
            let name = format!("{:08}.{}", samples.len(), cols.ext);
            samples.push(Sample {
                object: k,
                name,
                mtime,
                ..s
            });
        }
        objects.push(path);
        chunks.push(chunk);
    }
    let zstd = chunks.iter().filter(|c| c.is_some()).count();
    Ok(Scan {
        format: Format::Mds,
        derived: Vec::new(),
        objects,
        chunks,
        samples,
        fields,
        compression: if zstd > 0 {
            format!("zstd ({zstd} shards, served through the chunk cache)")
        } else {
            "none".into()
        },
        labels: "the integer column (label) as stored; class names from the first str column"
            .into(),
    })
}

#[cfg(test)]
mod tests;
