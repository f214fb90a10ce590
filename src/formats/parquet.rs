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

/// One row's values that loosefs reads: the image bytes and path, the label.
#[derive(Debug, Default)]
struct RowValues {
    data: Option<Vec<u8>>,
    path: Option<String>,
    label: Option<i64>,
}

/// The image feature's `bytes`/`path` and the label column of one row, as the crate reads it.
fn row_values(row: &parquet::record::Row, image: &str, label: Option<&str>) -> RowValues {
    let mut v = RowValues::default();
    for (name, field) in row.get_column_iter() {
        match field {
            Field::Group(img) if name == image => {
                for (n, x) in img.get_column_iter() {
                    match (n.as_str(), x) {
                        ("bytes", Field::Bytes(b)) => v.data = Some(b.data().to_vec()),
                        ("path", Field::Str(s)) => v.path = Some(s.clone()),
                        _ => {}
                    }
                }
            }
            Field::Long(x) if Some(name.as_str()) == label => v.label = Some(*x),
            Field::Int(x) if Some(name.as_str()) == label => v.label = Some(i64::from(*x)),
            _ => {}
        }
    }
    v
}

/// Where a PLAIN value `u32 len | data` is stored in `hay` (at or after its start): the offset
/// of `data`, checked byte for byte. `None` when it is not stored in place.
fn locate(hay: &[u8], data: &[u8]) -> Option<usize> {
    let mut want = (u32::try_from(data.len()).ok()?).to_le_bytes().to_vec();
    want.extend_from_slice(&data[..data.len().min(60)]);
    let at = memchr::memmem::find(hay, &want)? + 4;
    (hay.get(at..at.checked_add(data.len())?) == Some(data)).then_some(at)
}

/// One Parquet file being scanned: its map, metadata and the columns loosefs reads.
struct ParquetFile<'a> {
    path: &'a Path,
    map: memmap2::Mmap,
    reader: SerializedFileReader<std::fs::File>,
    image: String,
    image_col: usize,
    label: Option<String>,
    names: Option<Vec<String>>,
    mtime: i64,
}

impl<'a> ParquetFile<'a> {
    /// Opens `p` and finds its image feature's bytes column and its label column.
    fn open(p: &'a Path, label_column: Option<&str>) -> Result<ParquetFile<'a>> {
        let bad = |why: String| anyhow::anyhow!("{}: {why}", p.display());
        let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
        // SAFETY: a read-only map of a dataset file that must not change while indexed.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        let reader = SerializedFileReader::new(f)
            .map_err(|e| bad(format!("not a readable Parquet file ({e})")))?;
        let md = reader.metadata().file_metadata();
        let hf = (md.key_value_metadata())
            .and_then(|kv| kv.iter().find(|x| x.key == "huggingface"))
            .and_then(|x| x.value.clone());
        let (image, label, names) = features(hf.as_deref());
        let (label, names) = match label_column {
            Some(l) if label.as_deref() != Some(l) => (Some(l.to_string()), None),
            _ => (label, names),
        };
        let image =
            image.ok_or_else(|| bad("no Image feature in the `huggingface` metadata".into()))?;
        let schema = md.schema_descr();
        let bytes_col = format!("{image}.bytes");
        let image_col = (0..schema.num_columns())
            .find(|&i| schema.column(i).path().string() == bytes_col)
            .ok_or_else(|| bad(format!("no column {bytes_col}")))?;
        Ok(ParquetFile {
            path: p,
            map,
            reader,
            image,
            image_col,
            label,
            names,
            mtime: mtime_of(p),
        })
    }

    /// Every column's path, for `info`.
    fn columns(&self) -> Vec<String> {
        let schema = self.reader.metadata().file_metadata().schema_descr();
        (0..schema.num_columns())
            .map(|i| schema.column(i).path().string())
            .collect()
    }

    /// The samples of every row, `row_no` counting rows across files. Row groups whose image
    /// column is stored in place are served from the file (object `object`); the others become
    /// chunks, pushed to `chunks` (objects numbered from `object + 1`).
    fn samples(
        &self,
        object: u32,
        row_no: &mut u64,
        chunks: &mut Vec<Option<ChunkSpec>>,
    ) -> Result<Vec<Sample>> {
        let bad = |why: String| anyhow::anyhow!("{}: {why}", self.path.display());
        let md = self.reader.metadata();
        let mut rows =
            (self.reader.get_row_iter(None)).map_err(|e| bad(format!("cannot read rows ({e})")))?;
        let mut out = Vec::new();
        for g in 0..md.num_row_groups() {
            let cc = md.row_group(g).column(self.image_col);
            let in_place = cc.compression() == parquet::basic::Compression::UNCOMPRESSED
                && cc.dictionary_page_offset().is_none();
            let (start, len) = cc.byte_range();
            let end = (start.checked_add(len))
                .filter(|&e| e <= self.map.len() as u64)
                .ok_or_else(|| {
                    bad(format!(
                        "row group {g}: column chunk past the end of the file"
                    ))
                })?;
            // In place: a cursor in the column chunk; else the offset in the group's chunk.
            let mut cursor = if in_place { start } else { 0 };
            let chunk_obj = object + chunks.len() as u32 + 1;
            for _ in 0..md.row_group(g).num_rows() {
                let row = (rows.next())
                    .ok_or_else(|| bad("fewer rows than the metadata says".into()))?
                    .map_err(|e| bad(format!("row {row_no}: {e}")))?;
                let v = row_values(&row, &self.image, self.label.as_deref());
                let data = v.data.ok_or_else(|| {
                    bad(format!("row {row_no} has no image bytes (only a path): it cannot be served from the file"))
                })?;
                let range = if in_place {
                    let hay = &self.map[cursor as usize..end as usize];
                    let at = cursor + locate(hay, &data).ok_or_else(|| {
                        bad(format!("row {row_no}: its image bytes are not stored in place (not PLAIN, or compressed pages)"))
                    })? as u64;
                    at..at + data.len() as u64
                } else {
                    cursor..cursor + data.len() as u64
                };
                cursor = range.end;
                let name = match v.path.as_deref().map(|s| s.rsplit('/').next().unwrap_or(s)) {
                    Some(b) if !b.is_empty() => b.to_string(),
                    _ => format!("{row_no:08}.{}", sniff_ext(&data)),
                };
                let names = self.names.as_ref();
                out.push(Sample {
                    object: if in_place { object } else { chunk_obj },
                    range,
                    label: v.label,
                    class: v
                        .label
                        .and_then(|l| names?.get(usize::try_from(l).ok()?).cloned()),
                    name,
                    mtime: self.mtime,
                    ..Sample::default()
                });
                *row_no += 1;
            }
            if !in_place {
                chunks.push(Some(ChunkSpec {
                    codec: crate::storage::chunks::Codec::ParquetRowGroup,
                    offset: 0,
                    stored_len: 0,
                    len: cursor,
                    crc32: None,
                    parquet: Some((g, self.image.clone())),
                }));
            }
        }
        Ok(out)
    }
}

/// Reads every row once (labels, paths and image bytes) and locates each image in place. A
/// panic inside the Parquet crate on a damaged file is caught and reported as a refusal of
/// that file.
pub fn scan(src: &Path, label_column: Option<&str>) -> Result<Scan> {
    let files = files(src)?;
    let mut objects = Vec::new();
    let mut chunks = Vec::new();
    let mut samples = Vec::new();
    let mut fields = Vec::new();
    let mut row_no = 0u64;
    for p in &files {
        let object = objects.len() as u32;
        let mut groups = Vec::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let f = ParquetFile::open(p, label_column)?;
            if fields.is_empty() {
                fields = f.columns();
            }
            f.samples(object, &mut row_no, &mut groups)
        }))
        .unwrap_or_else(|e| {
            let why = crate::stats::panic_message(&*e);
            bail!(
                "{}: the Parquet reader failed on damaged data ({why})",
                p.display()
            )
        })?;
        samples.extend(found);
        objects.push(p.clone());
        chunks.push(None);
        for g in groups {
            objects.push(p.clone());
            chunks.push(g);
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

#[cfg(test)]
mod tests;
