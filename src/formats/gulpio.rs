//! GulpIO directories (`formats.md` §2, gulpio2 `fileio.py`): `data_N.gulp` holds JPEG frames,
//! each NUL-padded to 4 bytes; `meta_N.gmeta` (JSON) gives per item `frame_info` entries
//! `[loc, pad, length]` (length includes the pad) and `meta_data[0].label`; `label2idx.json`
//! maps labels to class numbers. Frames are served in place, one file per frame
//! (`<id>` for one-frame items, `<id-stem>_NNNN.jpg` for videos), under the label's name.
//! A data file without its meta file cannot be located and is reported, not guessed.

use super::{Format, Sample, Scan, list_dir, mtime_of};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
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

/// One item of a `.gmeta` file: its frames as `[loc, pad, length]` (length includes the pad)
/// and its metadata, whose first entry's `label` names the class.
#[derive(Debug, serde::Deserialize)]
struct Item {
    frame_info: Vec<[u64; 3]>,
    #[serde(default)]
    meta_data: Vec<Value>,
}

/// The frames of meta file `meta` (JSON bytes) as samples of object `object`, in data-file
/// order: each frame's JPEG bytes without its pad, named by item id (`<id>` or `<id>.jpg` for
/// one frame, `<stem>_NNNN.jpg` for videos), class = the item's label. Errors: not a map of
/// items, a pad larger than its frame, a frame whose end overflows.
fn parse_meta(meta: &[u8], object: u32) -> Result<Vec<Sample>, String> {
    let items: BTreeMap<String, Item> =
        serde_json::from_slice(meta).map_err(|e| format!("not a GulpIO meta file ({e})"))?;
    let mut found = Vec::new();
    for (id, item) in &items {
        let class = (item.meta_data.first())
            .and_then(|m| m.get("label"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let stem = id.rfind('.').map_or(id.as_str(), |i| &id[..i]);
        for (f, &[loc, pad, length]) in item.frame_info.iter().enumerate() {
            let end = length
                .checked_sub(pad)
                .and_then(|l| loc.checked_add(l))
                .ok_or_else(|| {
                    format!("item {id}: frame {f} [{loc}, {pad}, {length}] is not a byte range")
                })?;
            let name = match (item.frame_info.len(), id.contains('.')) {
                (1, true) => id.clone(),
                (1, false) => format!("{id}.jpg"),
                _ => format!("{stem}_{f:04}.jpg"),
            };
            found.push(Sample {
                object,
                range: loc..end,
                class: class.clone(),
                name,
                ..Sample::default()
            });
        }
    }
    found.sort_by_key(|s| s.range.start);
    Ok(found)
}

/// Class numbers: `label2idx.json`'s when given, else the sorted label names' positions.
fn number_classes(samples: &mut [Sample], l2i: Option<&HashMap<String, i64>>) {
    let mut names: Vec<String> = samples.iter().filter_map(|s| s.class.clone()).collect();
    names.sort();
    names.dedup();
    for s in samples {
        s.label = s.class.as_ref().and_then(|c| match l2i {
            Some(map) => map.get(c).copied(),
            None => names.binary_search(c).ok().map(|i| i as i64),
        });
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
        let found = parse_meta(&std::fs::read(m)?, objects.len() as u32)
            .map_err(|e| anyhow::anyhow!("{}: {e}", m.display()))?;
        let mtime = mtime_of(data);
        samples.extend(found.into_iter().map(|s| Sample { mtime, ..s }));
        objects.push(data.clone());
    }
    for d in &datas {
        if !objects.contains(d) {
            log::warn!(
                "{}: no .gmeta file describes it; its frames cannot be located and are not shown",
                d.display()
            );
            crate::eprintln_lossy!(
                "loosefs: warning: {}: no .gmeta file describes it; its frames are not shown",
                d.display()
            );
        }
    }
    number_classes(&mut samples, l2i.as_ref());
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (n, b) in files {
            std::fs::write(d.path().join(n), b).unwrap();
        }
        d
    }

    fn meta(v: serde_json::Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn frames_are_found_in_place_in_data_order_with_their_classes() {
        // data: "AAAA" (id b, 3 bytes + 1 pad), "BBBBBB\0\0" (video v, 2 frames).
        let m = meta(json!({
            "v.mp4": {"frame_info": [[4, 2, 4], [8, 0, 4]], "meta_data": [{"label": "dog"}]},
            "b": {"frame_info": [[0, 1, 4]], "meta_data": [{"label": "cat"}]},
            "c.png": {"frame_info": [[12, 0, 1]], "meta_data": []},
        }));
        let d = dir(&[
            ("meta_0.gmeta", m),
            ("data_0.gulp", b"AAA\0BB\0\0CCCCD".to_vec()),
        ]);
        let s = scan(d.path()).unwrap();
        let names: Vec<_> = s.samples.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["b.jpg", "v_0000.jpg", "v_0001.jpg", "c.png"]);
        let ranges: Vec<_> = s.samples.iter().map(|x| x.range.clone()).collect();
        assert_eq!(ranges, [0..3, 4..6, 8..12, 12..13]);
        // No label2idx.json: classes numbered in sorted name order; no label, no class.
        let labels: Vec<_> = s.samples.iter().map(|x| x.label).collect();
        assert_eq!(labels, [Some(0), Some(1), Some(1), None]);
        assert!(sniff(d.path()).is_ok());
    }

    #[test]
    fn label2idx_gives_the_class_numbers() {
        let m = meta(json!({"a": {"frame_info": [[0, 0, 1]], "meta_data": [{"label": "cat"}]}}));
        let l2i = meta(json!({"cat": 41}));
        let d = dir(&[
            ("meta_3.gmeta", m),
            ("data_3.gulp", b"x".to_vec()),
            ("label2idx.json", l2i),
        ]);
        assert_eq!(scan(d.path()).unwrap().samples[0].label, Some(41));
        std::fs::write(d.path().join("label2idx.json"), b"[1]").unwrap();
        let e = format!("{:#}", scan(d.path()).unwrap_err());
        assert!(e.contains("label2idx.json is not a label map"), "{e}");
    }

    #[test]
    fn crafted_frames_are_refused_naming_the_meta_file() {
        for (frames, want) in [
            (json!([[0, 5, 4]]), "not a byte range"),
            (json!([[u64::MAX, 0, 4]]), "not a byte range"),
            (json!([[0, 0]]), "not a GulpIO meta file"),
            (json!("x"), "not a GulpIO meta file"),
        ] {
            let m = meta(json!({"a": {"frame_info": frames}}));
            let d = dir(&[("meta_0.gmeta", m), ("data_0.gulp", b"x".to_vec())]);
            let e = format!("{:#}", scan(d.path()).unwrap_err());
            assert!(
                e.contains("meta_0.gmeta") && e.contains(want),
                "{want}: {e}"
            );
        }
        let d = dir(&[("meta_0.gmeta", meta(json!({})))]);
        let e = format!("{:#}", scan(d.path()).unwrap_err());
        assert!(e.contains("data_0.gulp is missing"), "{e}");
        let d = dir(&[("meta_x.gmeta", meta(json!({})))]);
        assert!(format!("{:#}", scan(d.path()).unwrap_err()).contains("no chunk number"));
        assert!(sniff(dir(&[]).path()).is_err());
    }
}
