//! LitData directories (`formats.md` §3, `litdata/streaming/{writer,item_loader}.py`):
//! `index.json` lists chunks and the leaves of every item (`data_format`); an uncompressed
//! chunk is `u32 n | u32 offsets[n+1] | items`, an item one u32 size per leaf, then the leaves'
//! bytes. The image is the first `jpeg`/`png` leaf (the original file bytes), served in place;
//! the label the first `int` leaf, the class name the first `str` leaf. Compressed or encrypted
//! chunks are refused, naming the index.

use super::{Format, Le, Sample, Scan, mtime_of};
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

/// Reads `index.json` and every chunk's offset table and leaf sizes.
pub fn scan(src: &Path) -> Result<Scan> {
    let ipath = src.join("index.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&ipath)?)
        .with_context(|| format!("{}: not JSON", ipath.display()))?;
    let cfg = &v["config"];
    if !cfg["compression"].is_null() || !cfg["encryption"].is_null() {
        bail!(
            "{}: chunks are compressed or encrypted ({} / {}): loosefs serves uncompressed LitData chunks in place",
            ipath.display(),
            cfg["compression"],
            cfg["encryption"]
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
        // SAFETY: a read-only map of a dataset file that must not change while indexed.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        let bad = |why: String| anyhow::anyhow!("{}: {why}", path.display());
        let mut le = Le::new(&map, 0);
        let n = le.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
        if let Some(want) = c["chunk_size"].as_u64() {
            if want != n as u64 {
                return Err(bad(format!("{n} items, index.json says {want}")));
            }
        }
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
                    "item {i} at {s}..{e} lies past the end of the chunk"
                )));
            }
            let mut r = Le::new(&map[..e], s);
            let lens: Vec<u64> = (0..formats.len())
                .map(|_| r.u32().map(u64::from))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("item {i}: truncated sizes")))?;
            let mut at = r.at as u64;
            let mut ranges = Vec::with_capacity(lens.len());
            for l in &lens {
                ranges.push(at..at + l);
                at += l;
            }
            if at > e as u64 {
                return Err(bad(format!("item {i}: its leaves run past its end")));
            }
            let leaf = |j: usize| &map[ranges[j].start as usize..ranges[j].end as usize];
            let ext = if formats[image] == "png" {
                "png"
            } else {
                "jpg"
            };
            samples.push(Sample {
                object: k,
                range: ranges[image].clone(),
                label: label.map(|j| i64::from_le_bytes(leaf(j).try_into().unwrap_or_default())),
                class: class.map(|j| String::from_utf8_lossy(leaf(j)).into_owned()),
                name: format!("{global:08}.{ext}"),
                mtime,
                ..Sample::default()
            });
            global += 1;
        }
        objects.push(path);
    }
    Ok(Scan {
        format: Format::Litdata,
        objects,
        samples,
        fields: formats,
        compression: "none".into(),
        labels: "the int leaf as stored; class names from the first str leaf".into(),
    })
}
