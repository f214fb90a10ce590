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
use std::ops::Range;
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

/// `index.json` as LitData's writer leaves it: only the fields loosefs reads.
#[derive(Debug, serde::Deserialize)]
struct IndexJson {
    chunks: Vec<ChunkMeta>,
    config: Config,
}

/// The dataset's `config`: codec, leaf formats, encryption.
#[derive(Debug, serde::Deserialize)]
struct Config {
    #[serde(default)]
    compression: Option<String>,
    #[serde(default)]
    compression_level: Option<Value>,
    data_format: Vec<String>,
    #[serde(default)]
    encryption: Option<Value>,
}

/// One chunk's entry: its file name and item count.
#[derive(Debug, serde::Deserialize)]
struct ChunkMeta {
    filename: String,
    #[serde(default)]
    chunk_size: Option<u64>,
}

/// The leaves loosefs reads: the image (first jpeg/png), label (first int), class (first str).
#[derive(Debug, Clone, Copy)]
struct Leaves {
    count: usize,
    image: usize,
    png: bool,
    label: Option<usize>,
    class: Option<usize>,
}

impl Leaves {
    fn new(formats: &[String]) -> Result<Leaves, String> {
        let image = (formats.iter().position(|f| f == "jpeg" || f == "png"))
            .ok_or_else(|| format!("no jpeg or png leaf in {formats:?}"))?;
        Ok(Leaves {
            count: formats.len(),
            image,
            png: formats[image] == "png",
            label: formats.iter().position(|f| f == "int"),
            class: formats.iter().position(|f| f == "str"),
        })
    }
}

/// How the chunks are stored, from `config`: zstd or not, and the zstd level name. Errors:
/// encryption, another codec or level.
fn codec(cfg: &Config) -> Result<(bool, &str), String> {
    if cfg.encryption.as_ref().is_some_and(|e| !e.is_null()) {
        return Err("chunks are encrypted: loosefs cannot serve them".into());
    }
    let zstd = match cfg.compression.as_deref() {
        None => false,
        Some("zstd") => true,
        Some(c) => {
            return Err(format!(
                "chunks compressed with {c}: loosefs serves zstd or uncompressed LitData chunks"
            ));
        }
    };
    let level = (cfg.compression_level.as_ref())
        .and_then(Value::as_str)
        .unwrap_or("chunk");
    if zstd && level != "batch" && level != "chunk" {
        return Err(format!(
            "compression_level {level:?}: loosefs serves zstd chunks at the batch or chunk level"
        ));
    }
    Ok((zstd, level))
}

/// One storage object of a chunk file: its decompressed bytes (empty for the mapped file
/// itself), its chunk spec (None: plain) and the item ranges in it.
type Part = (Vec<u8>, Option<ChunkSpec>, Vec<Range<usize>>);

/// The frames of an `LDFZ01` (batch-level zstd) chunk `map` of file `path`, each decompressed
/// (bounded by its declared length and [`crate::storage::chunks::MAX_CHUNK`]) with its items'
/// ranges in it.
fn ldfz_parts(map: &[u8], path: &Path) -> Result<Vec<Part>> {
    let bad = |why: &str| anyhow::anyhow!("{}: {why}", path.display());
    let mut le = Le::new(map, 8);
    let hdr = (le.u16(), le.u16(), le.u32(), le.u32(), le.u32());
    let (Some(_ver), Some(_flags), Some(n), Some(_rows), Some(nf)) = hdr else {
        return Err(bad("truncated LDFZ01 header"));
    };
    if u64::from(n) >= map.len() as u64 / 4 {
        return Err(bad("truncated LDFZ01 offset table"));
    }
    let offsets: Vec<usize> = (0..=n)
        .map(|_| le.u32().map(|o| o as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("truncated LDFZ01 offset table"))?;
    let mut parts = Vec::new();
    for k in 0..nf {
        let fr = (le.u32(), le.u32(), le.u64(), le.u32(), le.u32());
        let (Some(first), Some(count), Some(off), Some(clen), Some(ulen)) = fr else {
            return Err(bad("truncated LDFZ01 frame table"));
        };
        let items = first.checked_add(count).filter(|&e| e <= n);
        let (Some(end), Some(_)) = (
            items,
            off.checked_add(u64::from(clen))
                .filter(|&e| e <= map.len() as u64),
        ) else {
            return Err(bad(&format!(
                "frame {k} lies past the end of the chunk or its items"
            )));
        };
        let spec = ChunkSpec {
            codec: Codec::Zstd,
            offset: off,
            stored_len: u64::from(clen),
            len: u64::from(ulen),
            crc32: None,
            parquet: None,
        };
        let data = spec.open(path)?.decompress()?;
        let base = offsets[first as usize];
        let items = (first as usize..end as usize)
            .map(|i| offsets[i].wrapping_sub(base)..offsets[i + 1].wrapping_sub(base))
            .collect();
        parts.push((data, Some(spec), items));
    }
    Ok(parts)
}

/// A chunk-level zstd chunk: the whole uncompressed layout as one stream, bounded by
/// [`crate::storage::chunks::MAX_CHUNK`].
fn whole_zstd_part(map: &[u8], path: &Path) -> Result<Part> {
    let max = crate::storage::chunks::MAX_CHUNK;
    let data = zstd::stream::read::Decoder::new(map)
        .and_then(|d| crate::storage::chunks::read_declared(d, max))
        .map_err(|e| anyhow::anyhow!("{}: not a zstd stream ({e})", path.display()))?;
    if data.len() as u64 > max {
        bail!(
            "{}: decompresses to more than the {max} byte limit for one chunk",
            path.display()
        );
    }
    let spec = ChunkSpec {
        codec: Codec::Zstd,
        offset: 0,
        stored_len: map.len() as u64,
        len: data.len() as u64,
        crc32: None,
        parquet: None,
    };
    let items =
        super::offset_table(&data).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((data, Some(spec), items))
}

/// Item `i` at `item` of chunk bytes `bytes`: one u32 size per leaf, then the leaves.
fn parse_item(
    bytes: &[u8],
    item: Range<usize>,
    leaves: Leaves,
    i: usize,
) -> Result<Sample, String> {
    if item.start > item.end || item.end > bytes.len() {
        return Err(format!(
            "item {i} at {}..{} lies past the end of its chunk",
            item.start, item.end
        ));
    }
    let mut r = Le::new(&bytes[..item.end], item.start);
    let lens: Vec<u64> = (0..leaves.count)
        .map(|_| r.u32().map(u64::from))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("item {i}: truncated sizes"))?;
    let ranges = super::consecutive(r.at as u64, &lens, item.end as u64)
        .ok_or_else(|| format!("item {i}: its leaves run past its end"))?;
    let leaf = |j: usize| &bytes[ranges[j].start as usize..ranges[j].end as usize];
    Ok(Sample {
        range: ranges[leaves.image].clone(),
        label: (leaves.label).map(|j| i64::from_le_bytes(leaf(j).try_into().unwrap_or_default())),
        class: (leaves.class).map(|j| String::from_utf8_lossy(leaf(j)).into_owned()),
        ..Sample::default()
    })
}

/// The storage objects of chunk `name` of `src`: its frames, its whole decompressed stream,
/// or the file itself.
fn chunk_parts(
    src: &Path,
    c: &ChunkMeta,
    zstd: bool,
) -> Result<(std::path::PathBuf, memmap2::Mmap, Vec<Part>)> {
    let path = src.join(&c.filename);
    let f = std::fs::File::open(&path).with_context(|| {
        format!(
            "{}: chunk {} is missing",
            src.join("index.json").display(),
            c.filename
        )
    })?;
    // SAFETY: a read-only map of a dataset file that must not change while indexed.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    let bad = |why: String| anyhow::anyhow!("{}: {why}", path.display());
    let parts = if map.starts_with(b"LDFZ01\0\0") {
        ldfz_parts(&map, &path)?
    } else if zstd {
        vec![whole_zstd_part(&map, &path)?]
    } else {
        let items = super::offset_table(&map).map_err(bad)?;
        if let Some(want) = c.chunk_size.filter(|&w| w != items.len() as u64) {
            return Err(bad(format!(
                "{} items, index.json says {want}",
                items.len()
            )));
        }
        vec![(Vec::new(), None, items)]
    };
    Ok((path, map, parts))
}

/// Reads `index.json` and every chunk's offset table and leaf sizes.
pub fn scan(src: &Path) -> Result<Scan> {
    let ipath = src.join("index.json");
    let index: IndexJson = serde_json::from_slice(&std::fs::read(&ipath)?)
        .with_context(|| format!("{}: not a LitData index", ipath.display()))?;
    let at = |e: String| anyhow::anyhow!("{}: {e}", ipath.display());
    let (zstd, level) = codec(&index.config).map_err(at)?;
    let level = level.to_string();
    let leaves = Leaves::new(&index.config.data_format).map_err(at)?;
    let ext = if leaves.png { "png" } else { "jpg" };
    let (mut objects, mut specs, mut samples) = (Vec::new(), Vec::new(), Vec::new());
    for c in &index.chunks {
        if c.filename.contains('/') {
            bail!(
                "{}: chunk name {:?} is not a plain file name",
                ipath.display(),
                c.filename
            );
        }
        let (path, map, parts) = chunk_parts(src, c, zstd)?;
        let mtime = mtime_of(&path);
        for (data, spec, items) in parts {
            let bytes: &[u8] = if spec.is_some() { &data } else { &map };
            let k = objects.len() as u32;
            for (i, item) in items.into_iter().enumerate() {
                let s = parse_item(bytes, item, leaves, i)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                let name = format!("{:08}.{ext}", samples.len());
                samples.push(Sample {
                    object: k,
                    name,
                    mtime,
                    ..s
                });
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
        fields: index.config.data_format,
        compression: if zstd {
            format!("zstd ({level} level, served through the chunk cache)")
        } else {
            "none".into()
        },
        labels: "the int leaf as stored; class names from the first str leaf".into(),
    })
}

#[cfg(test)]
mod tests;
