//! LitData parsing from byte fixtures: chunks written here in the layouts of `formats.md` §3
//! (uncompressed, chunk-level zstd, batch-level `LDFZ01` frames).

use super::*;
use serde_json::json;

/// An item of leaves image (jpeg), label (int), class (str).
fn item(img: &[u8], label: i64, class: &str) -> Vec<u8> {
    let leaves = [img, &label.to_le_bytes()[..], class.as_bytes()];
    let mut v = Vec::new();
    for l in leaves {
        v.extend_from_slice(&(l.len() as u32).to_le_bytes());
    }
    v.extend(leaves.concat());
    v
}

/// An uncompressed chunk: `u32 n | u32 offsets[n+1] (absolute) | items`.
fn chunk(items: &[Vec<u8>]) -> Vec<u8> {
    let n = items.len() as u32;
    let mut at = 4 + 4 * (n + 1);
    let mut v = n.to_le_bytes().to_vec();
    v.extend_from_slice(&at.to_le_bytes());
    for i in items {
        at += i.len() as u32;
        v.extend_from_slice(&at.to_le_bytes());
    }
    v.extend(items.concat());
    v
}

/// A batch-level zstd chunk of `items`, `per` items per frame.
fn ldfz(items: &[Vec<u8>], per: usize) -> Vec<u8> {
    let n = items.len() as u32;
    let frames: Vec<&[Vec<u8>]> = items.chunks(per).collect();
    let mut v = b"LDFZ01\0\0".to_vec();
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    for x in [n, per as u32, frames.len() as u32] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    let mut at = 0u32;
    v.extend_from_slice(&at.to_le_bytes());
    for i in items {
        at += i.len() as u32;
        v.extend_from_slice(&at.to_le_bytes());
    }
    let table_at = v.len();
    v.extend(vec![0u8; 24 * frames.len()]);
    let mut first = 0u32;
    for (k, f) in frames.iter().enumerate() {
        let raw = f.concat();
        let z = zstd::encode_all(&raw[..], 3).unwrap();
        let e = table_at + 24 * k;
        let off = v.len() as u64;
        v[e..e + 4].copy_from_slice(&first.to_le_bytes());
        v[e + 4..e + 8].copy_from_slice(&(f.len() as u32).to_le_bytes());
        v[e + 8..e + 16].copy_from_slice(&off.to_le_bytes());
        v[e + 16..e + 20].copy_from_slice(&(z.len() as u32).to_le_bytes());
        v[e + 20..e + 24].copy_from_slice(&(raw.len() as u32).to_le_bytes());
        v.extend(z);
        first += f.len() as u32;
    }
    v
}

fn dataset(config: serde_json::Value, chunks: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let list: Vec<_> = chunks
        .iter()
        .map(|(n, _)| json!({"filename": n, "chunk_bytes": 0}))
        .collect();
    let mut cfg =
        json!({"compression": null, "data_format": ["jpeg", "int", "str"], "encryption": null});
    for (k, v) in config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let index = json!({"chunks": list, "config": cfg, "updated_at": "0"});
    std::fs::write(d.path().join("index.json"), index.to_string()).unwrap();
    for (n, b) in chunks {
        std::fs::write(d.path().join(n), b).unwrap();
    }
    d
}

fn err(d: &tempfile::TempDir) -> String {
    format!("{:#}", scan(d.path()).unwrap_err())
}

fn three() -> Vec<Vec<u8>> {
    vec![
        item(b"\xff\xd8one", 4, "cat"),
        item(b"\xff\xd8two!", 5, "dog"),
        item(b"\xff\xd8three", 4, "cat"),
    ]
}

#[test]
fn uncompressed_items_are_found_in_place() {
    let c = chunk(&three());
    let d = dataset(json!({}), &[("chunk-0-0.bin", c.clone())]);
    assert!(sniff(d.path()).is_ok());
    let s = scan(d.path()).unwrap();
    assert_eq!(s.samples.len(), 3);
    assert!(s.chunks.iter().all(Option::is_none));
    let r = &s.samples[1].range;
    assert_eq!(&c[r.start as usize..r.end as usize], b"\xff\xd8two!");
    assert_eq!(s.samples[1].label, Some(5));
    assert_eq!(s.samples[1].class.as_deref(), Some("dog"));
    assert_eq!(s.samples[2].name, "00000002.jpg");
}

#[test]
fn chunk_and_batch_level_zstd_items_index_their_decompressed_bytes() {
    let items = three();
    let whole = zstd::encode_all(&chunk(&items)[..], 3).unwrap();
    let cfg = json!({"compression": "zstd", "compression_level": "chunk"});
    let s = scan(dataset(cfg, &[("c.bin", whole)]).path()).unwrap();
    assert_eq!(s.samples.len(), 3);
    assert_eq!(s.chunks.len(), 1);
    let cfg = json!({"compression": "zstd", "compression_level": "batch"});
    let d = dataset(cfg, &[("c.bin", ldfz(&items, 2))]);
    let s = scan(d.path()).unwrap();
    assert_eq!(s.objects.len(), 2, "one object per frame");
    assert_eq!(
        s.chunks[0].as_ref().unwrap().len,
        (items[0].len() + items[1].len()) as u64
    );
    // The third item is the first of the second frame: its range starts inside that frame.
    assert_eq!(s.samples[2].object, 1);
    assert_eq!(s.samples[2].range.start, 12);
    let labels: Vec<_> = s.samples.iter().map(|x| x.label).collect();
    assert_eq!(labels, [Some(4), Some(5), Some(4)]);
}

#[test]
fn a_chunk_level_zstd_bomb_stops_at_the_chunk_limit() {
    // 513 MiB of zeros compresses to about 20 KB: decoded only up to the limit, then refused.
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..=512 {
        std::io::Write::write_all(&mut enc, &zeros).unwrap();
    }
    let z = enc.finish().unwrap();
    let cfg = json!({"compression": "zstd"});
    let e = err(&dataset(cfg, &[("bomb.bin", z)]));
    assert!(e.contains("bomb.bin") && e.contains("limit"), "{e}");
}

#[test]
fn damaged_chunks_are_refused_naming_the_chunk() {
    let good = chunk(&three());
    let frames = ldfz(&three(), 2);
    let cases: Vec<(serde_json::Value, Vec<u8>, &str)> = vec![
        (json!({}), good[..3].to_vec(), "truncated header"),
        (json!({}), good[..good.len() - 1].to_vec(), "past the end"),
        (
            json!({}),
            {
                let mut b = good.clone();
                b[20..24].copy_from_slice(&999u32.to_le_bytes());
                b
            },
            "leaves run past its end",
        ),
        (
            json!({"compression": "zstd"}),
            good.clone(),
            "not a zstd stream",
        ),
        (json!({}), frames[..20].to_vec(), "truncated LDFZ01 header"),
        (json!({}), frames[..30].to_vec(), "LDFZ01 offset table"),
        (
            json!({}),
            frames[..44].to_vec(),
            "truncated LDFZ01 frame table",
        ),
        (
            json!({}),
            {
                let mut b = frames.clone();
                b[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
                b
            },
            "lies past the end of the chunk or its items",
        ),
    ];
    for (cfg, bytes, want) in cases {
        let e = err(&dataset(cfg, &[("chunk-0-0.bin", bytes)]));
        assert!(
            e.contains("chunk-0-0.bin") && e.contains(want),
            "{want}: {e}"
        );
    }
}

#[test]
fn unusable_configs_are_refused_naming_the_index() {
    let c = chunk(&three());
    for (cfg, want) in [
        (json!({"encryption": {"kind": "fernet"}}), "encrypted"),
        (json!({"compression": "gzip"}), "compressed with gzip"),
        (
            json!({"compression": "zstd", "compression_level": "sample"}),
            "batch or chunk",
        ),
        (
            json!({"data_format": ["int", "str"]}),
            "no jpeg or png leaf",
        ),
        (json!({"data_format": 3}), "not a LitData index"),
    ] {
        let e = err(&dataset(cfg, &[("c.bin", c.clone())]));
        assert!(e.contains("index.json") && e.contains(want), "{want}: {e}");
    }
    let e = err(&dataset(json!({}), &[("../c.bin", c.clone())]));
    assert!(e.contains("not a plain file name"), "{e}");
    let d = dataset(json!({}), &[]);
    std::fs::write(
        d.path().join("index.json"),
        json!({"chunks": [{"filename": "gone.bin"}], "config": {"data_format": ["jpeg"]}})
            .to_string(),
    )
    .unwrap();
    assert!(err(&d).contains("chunk gone.bin is missing"));
}
