//! Hugging Face `datasets` Parquet (`formats.md` §6): read with the `parquet` crate (arrow-rs).
//! The `huggingface` key of the file metadata names the features: the first `Image` feature
//! gives the image (`<name>.bytes`, `<name>.path`), the first `ClassLabel` the label and its
//! class names. datasets >= 4.6 writes image columns UNCOMPRESSED and PLAIN (each value
//! `u32 len | bytes`, contiguous in its page), so the bytes are served in place: each row's
//! value, as the crate's row reader returns it, is found in its column chunk at or after the
//! previous one and checked byte for byte before its offset is kept. A row group whose image
//! column is compressed or dictionary-encoded (datasets < 4.6 writes Snappy + dictionary) is
//! served through the chunk cache instead: the row group's image values, decoded by the crate
//! and concatenated, are one chunk. Rows whose bytes are null (an external path) are refused,
//! naming the file and row.

use super::{ChunkSpec, Format, Sample, Scan, list_dir, mtime_of, read_at, sniff_ext};
use anyhow::{Context, Result, bail};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn files(src: &Path) -> Result<Vec<PathBuf>> {
    if src.is_dir() {
        let v = list_dir(src, |n| n.ends_with(".parquet"))?;
        if v.is_empty() {
            bail!("no .parquet files in {}", src.display());
        }
        Ok(v)
    } else {
        Ok(vec![src.to_path_buf()])
    }
}

/// Ok when `src` (or the first `.parquet` file of a directory) starts and ends with `PAR1`.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    let f = files(src).map_err(|e| e.to_string())?;
    let p = &f[0];
    let len = std::fs::metadata(p).map_err(|e| e.to_string())?.len();
    let head = read_at(p, 0, 4).map_err(|e| e.to_string())?;
    let tail = read_at(p, len.saturating_sub(4), 4).map_err(|e| e.to_string())?;
    if head == b"PAR1" && tail == b"PAR1" {
        Ok(())
    } else {
        Err(format!("{} is not a Parquet file", p.display()))
    }
}

/// (image feature, label feature, class names) from the `huggingface` metadata.
fn features(meta: Option<&str>) -> (Option<String>, Option<String>, Option<Vec<String>>) {
    let Some(v) = meta.and_then(|m| serde_json::from_str::<Value>(m).ok()) else {
        return (None, None, None);
    };
    let Some(feats) = v["info"]["features"].as_object() else {
        return (None, None, None);
    };
    let mut image = None;
    let mut label = None;
    let mut names = None;
    for (k, f) in feats {
        match f["_type"].as_str() {
            Some("Image") if image.is_none() => image = Some(k.clone()),
            Some("ClassLabel") if label.is_none() => {
                label = Some(k.clone());
                names = serde_json::from_value(f["names"].clone()).ok();
            }
            _ => {}
        }
    }
    (image, label, names)
}

/// Reads every row once (labels, paths and image bytes) and locates each image in place.
pub fn scan(src: &Path, label_column: Option<&str>) -> Result<Scan> {
    let files = files(src)?;
    let mut objects = Vec::new();
    let mut chunks = Vec::new();
    let mut samples = Vec::new();
    let mut fields = Vec::new();
    let mut row_no = 0u64;
    for p in &files {
        let k = objects.len();
        objects.push(p.clone());
        chunks.push(None);
        let bad = |why: String| anyhow::anyhow!("{}: {why}", p.display());
        let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
        // SAFETY: a read-only map of a dataset file that must not change while indexed.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        let reader = SerializedFileReader::new(f)
            .map_err(|e| bad(format!("not a readable Parquet file ({e})")))?;
        let md = reader.metadata();
        let hf = md
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|x| x.key == "huggingface"))
            .and_then(|x| x.value.clone());
        let (image, label, names) = features(hf.as_deref());
        let (label, names) = match label_column {
            Some(l) if label.as_deref() != Some(l) => (Some(l.to_string()), None),
            _ => (label, names),
        };
        let schema = md.file_metadata().schema_descr();
        let image = match image {
            Some(i) => i,
            None => bail!(
                "{}: no Image feature in the `huggingface` metadata",
                p.display()
            ),
        };
        let bytes_col = format!("{image}.bytes");
        let col = (0..schema.num_columns())
            .find(|&i| schema.column(i).path().string() == bytes_col)
            .ok_or_else(|| bad(format!("no column {bytes_col}")))?;
        if fields.is_empty() {
            fields = (0..schema.num_columns())
                .map(|i| schema.column(i).path().string())
                .collect();
        }
        let mtime = mtime_of(p);
        let mut row_iter = reader
            .get_row_iter(None)
            .map_err(|e| bad(format!("cannot read rows ({e})")))?;
        for g in 0..md.num_row_groups() {
            let cc = md.row_group(g).column(col);
            let in_place = cc.compression() == parquet::basic::Compression::UNCOMPRESSED
                && cc.dictionary_page_offset().is_none();
            // Compressed row group: its images, concatenated, are one chunk (object `chunk_obj`).
            let chunk_obj = objects.len() as u32;
            let mut chunk_len = 0u64;
            let (start, len) = cc.byte_range();
            let end = start
                .checked_add(len)
                .filter(|&e| e <= map.len() as u64)
                .ok_or_else(|| {
                    bad(format!(
                        "row group {g}: column chunk past the end of the file"
                    ))
                })?;
            let mut cursor = start as usize;
            for _ in 0..md.row_group(g).num_rows() {
                let row = row_iter
                    .next()
                    .ok_or_else(|| bad("fewer rows than the metadata says".into()))?
                    .map_err(|e| bad(format!("row {row_no}: {e}")))?;
                let mut data: Option<Vec<u8>> = None;
                let mut path = None;
                let mut lab = None;
                for (name, field) in row.get_column_iter() {
                    match field {
                        Field::Group(img) if *name == image => {
                            for (n, v) in img.get_column_iter() {
                                match (n.as_str(), v) {
                                    ("bytes", Field::Bytes(b)) => data = Some(b.data().to_vec()),
                                    ("path", Field::Str(s)) => path = Some(s.clone()),
                                    _ => {}
                                }
                            }
                        }
                        Field::Long(x) if Some(name) == label.as_ref() => lab = Some(*x),
                        Field::Int(x) if Some(name) == label.as_ref() => lab = Some(i64::from(*x)),
                        _ => {}
                    }
                }
                let data = data.ok_or_else(|| {
                    bad(format!("row {row_no} has no image bytes (only a path): it cannot be served from the file"))
                })?;
                let ext = sniff_ext(&data);
                let name = match path.as_deref().map(|s| s.rsplit('/').next().unwrap_or(s)) {
                    Some(b) if !b.is_empty() => b.to_string(),
                    _ => format!("{row_no:08}.{ext}"),
                };
                let class =
                    lab.and_then(|l| names.as_ref()?.get(usize::try_from(l).ok()?).cloned());
                if !in_place {
                    samples.push(Sample {
                        object: chunk_obj,
                        range: chunk_len..chunk_len + data.len() as u64,
                        label: lab,
                        class,
                        name,
                        mtime,
                        ..Sample::default()
                    });
                    chunk_len += data.len() as u64;
                    row_no += 1;
                    continue;
                }
                // The value is `u32 len | bytes` at or after the previous one in this chunk.
                let mut want = (data.len() as u32).to_le_bytes().to_vec();
                want.extend_from_slice(&data[..data.len().min(60)]);
                let hay = &map[cursor..end as usize];
                let at = memchr::memmem::find(hay, &want)
                    .map(|i| cursor + i + 4)
                    .filter(|&a| map.get(a..a + data.len()) == Some(&data[..]))
                    .ok_or_else(|| {
                        bad(format!(
                            "row {row_no}: its image bytes are not stored in place (not PLAIN, or compressed pages)"
                        ))
                    })?;
                cursor = at + data.len();
                samples.push(Sample {
                    object: k as u32,
                    range: at as u64..cursor as u64,
                    label: lab,
                    class,
                    name,
                    mtime,
                    ..Sample::default()
                });
                row_no += 1;
            }
            if !in_place {
                objects.push(p.clone());
                chunks.push(Some(ChunkSpec {
                    codec: crate::storage::chunks::Codec::ParquetRowGroup,
                    offset: 0,
                    stored_len: 0,
                    len: chunk_len,
                    crc32: None,
                    parquet: Some((g, image.clone())),
                }));
            }
        }
    }
    let compressed = chunks.iter().filter(|c| c.is_some()).count();
    Ok(Scan {
        format: Format::Parquet,
        derived: Vec::new(),
        objects,
        chunks,
        samples,
        fields,
        compression: if compressed > 0 {
            format!("{compressed} row group(s) with a compressed or dictionary image column, served through the chunk cache")
        } else {
            "none (image column UNCOMPRESSED, PLAIN)".into()
        },
        labels: "ClassLabel ids; names from the `huggingface` metadata (NNNN_name when sorting the names would change the order)"
            .into(),
    })
}
