//! MDS parsing from byte fixtures: shards written here in the layout of `formats.md` §5.

use super::*;
use serde_json::json;

/// A column value: fixed-size bytes, or variable-size bytes (a u32 size precedes them).
enum Col<'a> {
    Fixed(&'a [u8]),
    Var(&'a [u8]),
}

/// A shard of `samples`: `u32 n | u32 offsets[n+1] | samples`.
fn shard(samples: &[Vec<Col>]) -> Vec<u8> {
    let bodies: Vec<Vec<u8>> = samples
        .iter()
        .map(|cols| {
            let mut sizes = Vec::new();
            let mut data = Vec::new();
            for c in cols {
                match c {
                    Col::Fixed(b) => data.extend_from_slice(b),
                    Col::Var(b) => {
                        sizes.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        data.extend_from_slice(b);
                    }
                }
            }
            [sizes, data].concat()
        })
        .collect();
    let n = bodies.len();
    let mut at = 4 + 4 * (n as u32 + 1);
    let mut out = (n as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&at.to_le_bytes());
    for b in &bodies {
        at += b.len() as u32;
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend(bodies.concat());
    out
}

/// A shard entry of `index.json` for columns image (jpeg), label (int), class (str).
fn meta(basename: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut m = json!({
        "column_names": ["image", "label", "class"],
        "column_encodings": ["jpeg", "int", "str"],
        "column_sizes": [null, 8, null],
        "compression": null,
        "format": "mds",
        "raw_data": {"basename": basename, "bytes": 0},
        "zip_data": null,
    });
    if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    m
}

/// A directory with `index.json` listing `metas` and the files `files`.
fn dataset(metas: Vec<serde_json::Value>, files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let index = json!({"shards": metas, "version": 2});
    std::fs::write(d.path().join("index.json"), index.to_string()).unwrap();
    for (name, bytes) in files {
        std::fs::write(d.path().join(name), bytes).unwrap();
    }
    d
}

fn jpeg_sample<'a>(img: &'a [u8], label: &'a [u8; 8], class: &'a [u8]) -> Vec<Col<'a>> {
    vec![Col::Var(img), Col::Fixed(label), Col::Var(class)]
}

fn err(d: &tempfile::TempDir) -> String {
    format!("{:#}", scan(d.path(), None).unwrap_err())
}

#[test]
fn samples_are_found_in_place_across_shards() {
    let (a, b) = (
        b"\xff\xd8first\xff\xd9".as_slice(),
        b"\xff\xd8second".as_slice(),
    );
    let s0 = shard(&[
        jpeg_sample(a, &7i64.to_le_bytes(), b"n01"),
        jpeg_sample(b, &(-2i64).to_le_bytes(), b"n02"),
    ]);
    let s1 = shard(&[jpeg_sample(a, &9i64.to_le_bytes(), b"n03")]);
    let d = dataset(
        vec![
            meta("shard.00000.mds", json!({})),
            meta("shard.00001.mds", json!({})),
        ],
        &[("shard.00000.mds", s0.clone()), ("shard.00001.mds", s1)],
    );
    let s = scan(d.path(), None).unwrap();
    assert_eq!(s.samples.len(), 3);
    assert_eq!(s.objects.len(), 2);
    assert_eq!(s.fields, ["image:jpeg", "label:int", "class:str"]);
    let r = &s.samples[1].range;
    assert_eq!(&s0[r.start as usize..r.end as usize], b);
    let labels: Vec<_> = s.samples.iter().map(|x| x.label).collect();
    assert_eq!(labels, [Some(7), Some(-2), Some(9)]);
    assert_eq!(s.samples[2].class.as_deref(), Some("n03"));
    assert_eq!(s.samples[2].object, 1);
    let names: Vec<_> = s.samples.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["00000000.jpg", "00000001.jpg", "00000002.jpg"]);
    // The str column is an extra field beside the image.
    assert_eq!(s.samples[0].extra.len(), 1);
    assert_eq!(s.samples[0].extra[0].0, "class");
}

#[test]
fn zstd_shards_are_chunks_of_their_decompressed_bytes() {
    let img = b"\xff\xd8zstd image".as_slice();
    let raw = shard(&[jpeg_sample(img, &3i64.to_le_bytes(), b"c")]);
    let z = zstd::encode_all(&raw[..], 3).unwrap();
    let m = meta(
        "shard.00000.mds",
        json!({"compression": "zstd:7", "raw_data": {"basename": "shard.00000.mds", "bytes": raw.len()},
               "zip_data": {"basename": "shard.00000.mds.zstd", "bytes": z.len()}}),
    );
    let d = dataset(vec![m], &[("shard.00000.mds.zstd", z)]);
    let s = scan(d.path(), None).unwrap();
    let spec = s.chunks[0].as_ref().expect("a chunk");
    assert_eq!(spec.len, raw.len() as u64);
    let r = &s.samples[0].range;
    assert_eq!(&raw[r.start as usize..r.end as usize], img);
    assert!(s.compression.contains("zstd"), "{}", s.compression);
}

#[test]
fn a_decompression_bomb_claim_is_refused_before_it_is_allocated() {
    let z = zstd::encode_all(&[0u8; 64][..], 3).unwrap();
    let m = meta(
        "s",
        json!({"compression": "zstd", "raw_data": {"basename": "s", "bytes": 1u64 << 62},
               "zip_data": {"basename": "s.zstd", "bytes": z.len()}}),
    );
    let d = dataset(vec![m], &[("s.zstd", z)]);
    let e = err(&d);
    assert!(e.contains("s.zstd") && e.contains("limit"), "{e}");
}

#[test]
fn pil_rgb_images_are_served_as_pixels_and_other_modes_refused() {
    let pil = |mode: &[u8], w: u32, h: u32, px: usize| {
        let mut v = [
            w.to_le_bytes(),
            h.to_le_bytes(),
            (mode.len() as u32).to_le_bytes(),
        ]
        .concat();
        v.extend_from_slice(mode);
        v.extend(std::iter::repeat_n(7u8, px));
        v
    };
    let m = || {
        meta(
            "s",
            json!({"column_names": ["img", "label"], "column_encodings": ["pil", "int"]}),
        )
    };
    let good = pil(b"RGB", 2, 3, 18);
    let d = dataset(
        vec![m()],
        &[(
            "s",
            shard(&[vec![Col::Var(&good), Col::Fixed(&[1, 0, 0, 0, 0, 0, 0, 0])]]),
        )],
    );
    let s = scan(d.path(), None).unwrap();
    assert_eq!(s.samples[0].pixels, Some((2, 3)));
    assert_eq!(s.samples[0].range.end - s.samples[0].range.start, 18);
    assert!(s.samples[0].name.ends_with(".ppm"));
    for (bytes, want) in [
        (pil(b"L", 2, 3, 6), "mode L"),
        (pil(b"RGB", 2, 3, 17), "needs 18 bytes"),
        (pil(b"RGB", 2, 3, 0)[..10].to_vec(), "truncated pil header"),
    ] {
        let d = dataset(
            vec![m()],
            &[("s", shard(&[vec![Col::Var(&bytes), Col::Fixed(&[0; 8])]]))],
        );
        let e = err(&d);
        assert!(e.contains(want) && e.contains("sample 0"), "{want}: {e}");
    }
}

#[test]
fn damaged_shards_are_refused_naming_the_shard() {
    let good = shard(&[jpeg_sample(b"\xff\xd8x", &[0; 8], b"c")]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..2].to_vec(), "truncated header"),
        (good[..10].to_vec(), "truncated offset table"),
        (u32::MAX.to_le_bytes().to_vec(), "items claimed"),
        (good[..good.len() - 1].to_vec(), "past the end"),
        // The image's size claims more than the sample holds.
        (
            {
                let mut b = good.clone();
                b[12..16].copy_from_slice(&1000u32.to_le_bytes());
                b
            },
            "run past its end",
        ),
    ];
    for (bytes, want) in cases {
        let d = dataset(
            vec![meta("shard.00000.mds", json!({}))],
            &[("shard.00000.mds", bytes)],
        );
        let e = err(&d);
        assert!(
            e.contains("shard.00000.mds") && e.contains(want),
            "{want}: {e}"
        );
    }
}

#[test]
fn unusable_indexes_are_refused_with_the_reason() {
    let ok = shard(&[jpeg_sample(b"\xff\xd8x", &[0; 8], b"c")]);
    let cases = [
        (
            meta("s", json!({"compression": "gz"})),
            "compressed with gz",
        ),
        (meta("../s", json!({})), "climbs out"),
        (meta("/etc/passwd", json!({})), "climbs out"),
        (meta("missing", json!({})), "shard missing is missing"),
        (
            meta("s", json!({"column_encodings": ["int", "int", "str"]})),
            "no jpeg, png or pil",
        ),
        (
            meta("s", json!({"column_names": ["image"]})),
            "differ in number",
        ),
        (meta("s", json!({"compression": "zstd"})), "zip_data"),
    ];
    for (m, want) in cases {
        let d = dataset(vec![m], &[("s", ok.clone())]);
        let e = err(&d);
        assert!(e.contains("index.json") && e.contains(want), "{want}: {e}");
    }
    let d = dataset(vec![meta("s", json!({}))], &[("s", ok.clone())]);
    let e = format!("{:#}", scan(d.path(), Some("nope")).unwrap_err());
    assert!(e.contains("--label nope"), "{e}");
    assert_eq!(scan(d.path(), Some("label")).unwrap().samples.len(), 1);
    std::fs::write(d.path().join("index.json"), b"{\"shards\": 3}").unwrap();
    assert!(err(&d).contains("not an MDS index"));
    assert!(sniff(d.path()).is_err());
}
