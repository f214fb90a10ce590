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

/// Reads `index.json` and every shard's offset table and column sizes.
pub fn scan(src: &Path, label_column: Option<&str>) -> Result<Scan> {
    let ipath = src.join("index.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&ipath)?)
        .with_context(|| format!("{}: not JSON", ipath.display()))?;
    let shards = v["shards"].as_array().context("index.json: no shards")?;
    let mut objects = Vec::new();
    let mut chunks = Vec::new();
    let mut samples = Vec::new();
    let mut fields = Vec::new();
    let mut global = 0u64;
    for sh in shards {
        let basename = sh["raw_data"]["basename"]
            .as_str()
            .context("index.json: a shard without raw_data.basename")?;
        let compression = sh["compression"].as_str();
        let zstd = match compression {
            None => false,
            Some(c) if c == "zstd" || c.starts_with("zstd:") => true,
            Some(c) => bail!(
                "{}: shard {basename} is compressed with {c}: loosefs serves uncompressed and zstd MDS shards",
                ipath.display()
            ),
        };
        let basename = if zstd {
            sh["zip_data"]["basename"]
                .as_str()
                .context("index.json: a compressed shard without zip_data.basename")?
        } else {
            basename
        };
        if basename.split('/').any(|c| c == "..") || basename.starts_with('/') {
            bail!(
                "{}: shard name {basename:?} climbs out of the directory",
                ipath.display()
            );
        }
        let names: Vec<String> = serde_json::from_value(sh["column_names"].clone())
            .with_context(|| format!("{}: {basename}: column_names", ipath.display()))?;
        let encs: Vec<String> = serde_json::from_value(sh["column_encodings"].clone())
            .with_context(|| format!("{}: {basename}: column_encodings", ipath.display()))?;
        if names.len() != encs.len() {
            bail!(
                "{}: {basename}: column names and encodings differ in number",
                ipath.display()
            );
        }
        if fields.is_empty() {
            fields = names
                .iter()
                .zip(&encs)
                .map(|(n, e)| format!("{n}:{e}"))
                .collect();
        }
        let sizes: Vec<Option<u64>> = encs.iter().map(|e| fixed_size(e)).collect();
        let image = encs
            .iter()
            .position(|e| e == "jpeg" || e == "png" || e == "pil")
            .with_context(|| {
                format!(
                    "{}: {basename}: no jpeg, png or pil column",
                    ipath.display()
                )
            })?;
        let label = match label_column {
            Some(l) => Some(
                names
                    .iter()
                    .position(|n| n == l)
                    .filter(|&i| sizes[i] == Some(8))
                    .with_context(|| {
                        format!(
                            "{}: --label {l}: no 8-byte integer column of that name",
                            ipath.display()
                        )
                    })?,
            ),
            None => names
                .iter()
                .position(|n| n == "label")
                .filter(|&i| sizes[i] == Some(8))
                .or_else(|| encs.iter().position(|e| e == "int" || e == "int64")),
        };
        let class = encs.iter().position(|e| e == "str");
        let path = src.join(basename);
        let f = std::fs::File::open(&path)
            .with_context(|| format!("{}: shard {basename} is missing", ipath.display()))?;
        let bad = |why: String| anyhow::anyhow!("{}: {why}", path.display());
        let (map, chunk): (Box<dyn std::ops::Deref<Target = [u8]>>, _) = if zstd {
            let raw_len = sh["raw_data"]["bytes"]
                .as_u64()
                .context("index.json: a compressed shard without raw_data.bytes")?;
            let spec = ChunkSpec {
                codec: crate::storage::chunks::Codec::Zstd,
                offset: 0,
                stored_len: f.metadata()?.len(),
                len: raw_len,
                crc32: None,
                parquet: None,
            };
            let data = spec.open(&path)?.decompress()?;
            (Box::new(data), Some(spec))
        } else {
            // SAFETY: a read-only map of a dataset file that must not change while indexed.
            (Box::new(unsafe { memmap2::Mmap::map(&f) }?), None)
        };
        let mut le = Le::new(&map, 0);
        let n = le.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
        let offsets: Vec<u32> = (0..=n)
            .map(|_| le.u32())
            .collect::<Option<_>>()
            .ok_or_else(|| bad("truncated offset table".into()))?;
        let k = objects.len() as u32;
        let mtime = mtime_of(&path);
        for i in 0..n {
            let (s, e) = (offsets[i] as usize, offsets[i + 1] as usize);
            if s > e || e > map.len() {
                return Err(bad(format!(
                    "sample {i} at {s}..{e} lies past the end of the shard"
                )));
            }
            let mut r = Le::new(&map[..e], s);
            let mut lens = Vec::with_capacity(encs.len());
            for sz in &sizes {
                lens.push(match sz {
                    Some(x) => *x,
                    None => u64::from(
                        r.u32()
                            .ok_or_else(|| bad(format!("sample {i}: truncated")))?,
                    ),
                });
            }
            let ranges = super::consecutive(r.at as u64, &lens, e as u64)
                .ok_or_else(|| bad(format!("sample {i}: its columns run past its end")))?;
            let field = |c: usize| &map[ranges[c].start as usize..ranges[c].end as usize];
            let label = label.map(|c| i64::from_le_bytes(field(c).try_into().unwrap_or_default()));
            let class = class.map(|c| String::from_utf8_lossy(field(c)).into_owned());
            // A `pil` image: u32 width | u32 height | u32 mode length | mode | pixels; RGB pixels
            // are served in place behind a PPM header, other modes are refused.
            let (range, pixels, ext) = if encs[image] == "pil" {
                let r = &ranges[image];
                let mut le = Le::new(&map[..r.end as usize], r.start as usize);
                let (Some(w), Some(h), Some(ml)) = (le.u32(), le.u32(), le.u32()) else {
                    return Err(bad(format!("sample {i}: truncated pil header")));
                };
                let mode = le
                    .bytes(ml as usize)
                    .ok_or_else(|| bad(format!("sample {i}: truncated pil mode")))?;
                if mode != b"RGB" {
                    return Err(bad(format!(
                        "sample {i}: pil image in mode {}: loosefs serves RGB pil images (as PPM)",
                        String::from_utf8_lossy(mode)
                    )));
                }
                let start = le.at as u64;
                if r.end - start != u64::from(w) * u64::from(h) * 3 {
                    return Err(bad(format!(
                        "sample {i}: {w}x{h} RGB needs {} bytes, it has {}",
                        u64::from(w) * u64::from(h) * 3,
                        r.end - start
                    )));
                }
                (start..r.end, Some((w, h)), "ppm")
            } else {
                (
                    ranges[image].clone(),
                    None,
                    if encs[image] == "png" { "png" } else { "jpg" },
                )
            };
            let extra = (0..names.len())
                .filter(|&c| c != image && sizes[c].is_none())
                .map(|c| (names[c].clone(), ranges[c].clone()))
                .collect();
            samples.push(Sample {
                object: k,
                extra,
                range,
                pixels,
                label,
                class,
                name: format!("{global:08}.{ext}"),
                mtime,
                ..Sample::default()
            });
            global += 1;
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
