//! LitData directories (`formats.md` §3, `litdata/streaming/{writer,item_loader}.py`,
//! `framed_zstd.py`): `index.json` lists chunks and the leaves of every item (`data_format`);
//! an item is one u32 size per leaf, then the leaves' bytes. The image is the first
//! `jpeg`/`png` leaf (the original file bytes), the label the first `int` leaf, the class name
//! the first `str` leaf.
//!
//! Chunk layouts: uncompressed `u32 n | u32 offsets[n+1] (absolute) | items`, served in place;
//! zstd with `compression_level` `batch` (LitData's default for zstd): `"LDFZ01\0\0" | u16
//! version | u16 flags | u32 n | u32 frame_rows | u32 n_frames | u32 offsets[n+1] (into the
//! items' uncompressed concatenation) | n_frames × {u32 first_item, u32 n_items, u64 offset,
//! u32 compressed_len, u32 uncompressed_len} | zstd frames`, each frame a chunk of the chunk
//! cache; zstd `chunk` level: the whole uncompressed layout as one zstd stream, one chunk.
//! Sample-level zstd and encryption are refused, naming the index.

use super::{ChunkSpec, Format, Le, Sample, Scan, mtime_of};
use crate::storage::chunks::Codec;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::Path;

/// Ok when `src` is a directory whose `index.json` has `chunks` and `config`.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    let j = std::fs::read(src.join("index.json")).map_err(|e| format!("no index.json ({e})"))?;
    let v: Value = serde_json::from_slice(&j).map_err(|e| format!("index.json: {e}"))?;
    if v.get("chunks").is_some_and(Value::is_array) && v.get("config").is_some() {
        Ok(())
    } else {
        Err("index.json has no chunks and config".into())
    }
}

/// One storage object of a chunk file: its decompressed bytes (empty for the mapped file
/// itself), its chunk spec (None: plain) and the item ranges in it.
type Part = (Vec<u8>, Option<ChunkSpec>, Vec<(usize, usize)>);

/// Item ranges of an uncompressed chunk `data` (`u32 n | u32 offsets[n+1] | items`).
fn classic(data: &[u8], bad: &dyn Fn(String) -> anyhow::Error) -> Result<Vec<(usize, usize)>> {
    let mut le = Le::new(data, 0);
    let n = le.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
    let offsets: Vec<u32> = (0..=n)
        .map(|_| le.u32())
        .collect::<Option<_>>()
        .ok_or_else(|| bad("truncated offset table".into()))?;
    Ok((0..n)
        .map(|i| (offsets[i] as usize, offsets[i + 1] as usize))
        .collect())
}

/// Reads `index.json` and every chunk's offset table and leaf sizes.
pub fn scan(src: &Path) -> Result<Scan> {
    let ipath = src.join("index.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&ipath)?)
        .with_context(|| format!("{}: not JSON", ipath.display()))?;
    let cfg = &v["config"];
    if !cfg["encryption"].is_null() {
        bail!(
            "{}: chunks are encrypted: loosefs cannot serve them",
            ipath.display()
        );
    }
    let zstd = match cfg["compression"].as_str() {
        None => false,
        Some("zstd") => true,
        Some(c) => bail!(
            "{}: chunks compressed with {c}: loosefs serves zstd or uncompressed LitData chunks",
            ipath.display()
        ),
    };
    let level = cfg["compression_level"].as_str().unwrap_or("chunk");
    if zstd && level != "batch" && level != "chunk" {
        bail!(
            "{}: compression_level {level:?}: loosefs serves zstd chunks at the batch or chunk level",
            ipath.display()
        );
    }
    let formats: Vec<String> = serde_json::from_value(cfg["data_format"].clone())
        .with_context(|| format!("{}: config.data_format", ipath.display()))?;
    let image = formats
        .iter()
        .position(|f| f == "jpeg" || f == "png")
        .with_context(|| format!("{}: no jpeg or png leaf in {formats:?}", ipath.display()))?;
    let label = formats.iter().position(|f| f == "int");
    let class = formats.iter().position(|f| f == "str");
    let chunks = v["chunks"].as_array().context("index.json: no chunks")?;
    let mut objects = Vec::new();
    let mut specs = Vec::new();
    let mut samples = Vec::new();
    let mut global = 0u64;
    for c in chunks {
        let name = c["filename"]
            .as_str()
            .context("index.json: a chunk without filename")?;
        if name.contains('/') {
            bail!(
                "{}: chunk name {name:?} is not a plain file name",
                ipath.display()
            );
        }
        let path = src.join(name);
        let f = std::fs::File::open(&path)
            .with_context(|| format!("{}: chunk {name} is missing", ipath.display()))?;
        let flen = f.metadata()?.len();
        // SAFETY: a read-only map of a dataset file that must not change while indexed.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        let bad = |why: String| anyhow::anyhow!("{}: {why}", path.display());
        let mtime = mtime_of(&path);
        // (object's decompressed or mapped bytes, its chunk spec, item ranges in them)
        let mut parts: Vec<Part> = Vec::new();
        if map.starts_with(b"LDFZ01\0\0") {
            let mut le = Le::new(&map, 8);
            let hdr = (le.u16(), le.u16(), le.u32(), le.u32(), le.u32());
            let (Some(_ver), Some(_flags), Some(n), Some(_rows), Some(nf)) = hdr else {
                return Err(bad("truncated LDFZ01 header".into()));
            };
            let offsets: Vec<u32> = (0..=n)
                .map(|_| le.u32())
                .collect::<Option<_>>()
                .ok_or_else(|| bad("truncated LDFZ01 offset table".into()))?;
            for k in 0..nf {
                let fr = (le.u32(), le.u32(), le.u64(), le.u32(), le.u32());
                let (Some(first), Some(count), Some(off), Some(clen), Some(ulen)) = fr else {
                    return Err(bad("truncated LDFZ01 frame table".into()));
                };
                let end_item = first.checked_add(count).filter(|&e| e <= n);
                if end_item.is_none() || off.checked_add(u64::from(clen)).is_none_or(|e| e > flen) {
                    return Err(bad(format!(
                        "frame {k} lies past the end of the chunk or its items"
                    )));
                }
                let spec = ChunkSpec {
                    codec: Codec::Zstd,
                    offset: off,
                    stored_len: u64::from(clen),
                    len: u64::from(ulen),
                    crc32: None,
                    parquet: None,
                };
                let data = spec.open(&path)?.decompress()?;
                let base = offsets[first as usize] as usize;
                let items = (first..first + count)
                    .map(|i| {
                        let (s, e) = (
                            offsets[i as usize] as usize,
                            offsets[i as usize + 1] as usize,
                        );
                        (s.wrapping_sub(base), e.wrapping_sub(base))
                    })
                    .collect();
                parts.push((data, Some(spec), items));
            }
        } else if zstd {
            let data = zstd::stream::decode_all(&map[..])
                .map_err(|e| bad(format!("not a zstd stream ({e})")))?;
            let spec = ChunkSpec {
                codec: Codec::Zstd,
                offset: 0,
                stored_len: flen,
                len: data.len() as u64,
                crc32: None,
                parquet: None,
            };
            let items = classic(&data, &bad)?;
            parts.push((data, Some(spec), items));
        } else {
            if let Some(want) = c["chunk_size"].as_u64() {
                let n = Le::new(&map, 0)
                    .u32()
                    .ok_or_else(|| bad("truncated header".into()))?;
                if want != u64::from(n) {
                    return Err(bad(format!("{n} items, index.json says {want}")));
                }
            }
            let items = classic(&map, &bad)?;
            parts.push((Vec::new(), None, items));
        }
        for (data, spec, items) in parts {
            let bytes: &[u8] = if spec.is_some() { &data } else { &map };
            let k = objects.len() as u32;
            for (i, (s, e)) in items.into_iter().enumerate() {
                if s > e || e > bytes.len() {
                    return Err(bad(format!(
                        "item {i} at {s}..{e} lies past the end of its chunk"
                    )));
                }
                let mut r = Le::new(&bytes[..e], s);
                let lens: Vec<u64> = (0..formats.len())
                    .map(|_| r.u32().map(u64::from))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad(format!("item {i}: truncated sizes")))?;
                let ranges = super::consecutive(r.at as u64, &lens, e as u64)
                    .ok_or_else(|| bad(format!("item {i}: its leaves run past its end")))?;
                let leaf = |j: usize| &bytes[ranges[j].start as usize..ranges[j].end as usize];
                let ext = if formats[image] == "png" {
                    "png"
                } else {
                    "jpg"
                };
                samples.push(Sample {
                    object: k,
                    range: ranges[image].clone(),
                    label: label
                        .map(|j| i64::from_le_bytes(leaf(j).try_into().unwrap_or_default())),
                    class: class.map(|j| String::from_utf8_lossy(leaf(j)).into_owned()),
                    name: format!("{global:08}.{ext}"),
                    mtime,
                    ..Sample::default()
                });
                global += 1;
            }
            objects.push(path.clone());
            specs.push(spec);
        }
    }
    Ok(Scan {
        format: Format::Litdata,
        derived: Vec::new(),
        objects,
        chunks: specs,
        samples,
        fields: formats,
        compression: if zstd {
            format!("zstd ({level} level, served through the chunk cache)")
        } else {
            "none".into()
        },
        labels: "the int leaf as stored; class names from the first str leaf".into(),
    })
}
