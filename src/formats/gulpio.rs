//! GulpIO directories (`formats.md` §2, gulpio2 `fileio.py`): `data_N.gulp` holds JPEG frames,
//! each NUL-padded to 4 bytes; `meta_N.gmeta` (JSON) gives per item `frame_info` entries
//! `[loc, pad, length]` (length includes the pad) and `meta_data[0].label`; `label2idx.json`
//! maps labels to class numbers. Frames are served in place, one file per frame
//! (`<id>` for one-frame items, `<id-stem>_NNNN.jpg` for videos), under the label's name.
//! A data file without its meta file cannot be located and is reported, not guessed.

use super::{Format, Sample, Scan, list_dir, mtime_of};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

fn number(name: &str) -> Option<u64> {
    let d: String = name
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    d.parse().ok()
}

/// Ok when `src` is a directory with `.gulp` and `.gmeta` files.
pub fn sniff(src: &Path) -> std::result::Result<(), String> {
    let g = list_dir(src, |n| n.ends_with(".gmeta")).map_err(|e| e.to_string())?;
    if g.is_empty() {
        Err("no .gmeta files".into())
    } else {
        Ok(())
    }
}

/// Reads every `.gmeta` file.
pub fn scan(src: &Path) -> Result<Scan> {
    let metas = list_dir(src, |n| n.ends_with(".gmeta"))?;
    let datas = list_dir(src, |n| n.ends_with(".gulp"))?;
    let l2i: Option<HashMap<String, i64>> = match std::fs::read(src.join("label2idx.json")) {
        Ok(b) => Some(
            serde_json::from_slice(&b)
                .with_context(|| format!("{}: label2idx.json is not a label map", src.display()))?,
        ),
        Err(_) => None,
    };
    let mut objects = Vec::new();
    let mut samples = Vec::new();
    for m in &metas {
        let n = number(&m.file_name().unwrap_or_default().to_string_lossy())
            .with_context(|| format!("{}: no chunk number in the name", m.display()))?;
        let Some(data) = datas
            .iter()
            .find(|d| number(&d.file_name().unwrap_or_default().to_string_lossy()) == Some(n))
        else {
            bail!("{}: its data file data_{n}.gulp is missing", m.display());
        };
        let v: Value = serde_json::from_slice(&std::fs::read(m)?)
            .with_context(|| format!("{}: not JSON", m.display()))?;
        let items = v
            .as_object()
            .with_context(|| format!("{}: not a JSON object", m.display()))?;
        let k = objects.len() as u32;
        let mtime = mtime_of(data);
        let mut found = Vec::new();
        for (id, item) in items {
            let frames = item["frame_info"]
                .as_array()
                .with_context(|| format!("{}: item {id} has no frame_info", m.display()))?;
            let label = item["meta_data"][0]["label"].as_str().map(str::to_string);
            let stem = match id.rfind('.') {
                Some(i) => &id[..i],
                None => id.as_str(),
            };
            for (f, fi) in frames.iter().enumerate() {
                let t: Vec<u64> = serde_json::from_value(fi.clone()).with_context(|| {
                    format!(
                        "{}: item {id}: frame {f} is not [loc, pad, length]",
                        m.display()
                    )
                })?;
                let [loc, pad, length] = t[..] else {
                    bail!(
                        "{}: item {id}: frame {f} is not [loc, pad, length]",
                        m.display()
                    );
                };
                if pad > length {
                    bail!(
                        "{}: item {id}: frame {f} has pad {pad} > length {length}",
                        m.display()
                    );
                }
                let name = if frames.len() == 1 {
                    if id.contains('.') {
                        id.clone()
                    } else {
                        format!("{id}.jpg")
                    }
                } else {
                    format!("{stem}_{f:04}.jpg")
                };
                found.push(Sample {
                    object: k,
                    range: loc..loc + length - pad,
                    label: match (&l2i, &label) {
                        (Some(map), Some(l)) => map.get(l).copied(),
                        _ => None,
                    },
                    class: label.clone(),
                    name,
                    mtime,
                    ..Sample::default()
                });
            }
        }
        found.sort_by_key(|s| s.range.start);
        samples.extend(found);
        objects.push(data.clone());
    }
    for d in &datas {
        if !objects.contains(d) {
            log::warn!(
                "{}: no .gmeta file describes it; its frames cannot be located and are not shown",
                d.display()
            );
            eprintln!(
                "loosefs: warning: {}: no .gmeta file describes it; its frames are not shown",
                d.display()
            );
        }
    }
    // Without label2idx.json, class numbers follow the sorted label names.
    if l2i.is_none() {
        let mut names: Vec<String> = samples.iter().filter_map(|s| s.class.clone()).collect();
        names.sort();
        names.dedup();
        for s in &mut samples {
            s.label = s
                .class
                .as_ref()
                .and_then(|c| names.binary_search(c).ok())
                .map(|i| i as i64);
        }
    }
    Ok(Scan {
        format: Format::Gulpio,
        derived: Vec::new(),
        objects,
        chunks: Vec::new(),
        samples,
        fields: vec!["frames".into(), "meta_data".into()],
        compression: "none".into(),
        labels: "label2idx.json numbers; directories named by the labels".into(),
    })
}
