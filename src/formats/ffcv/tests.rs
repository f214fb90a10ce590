//! FFCV parsing from byte fixtures: `.beton` files written here in the layout of `formats.md` §1
//! (fields `[RGBImage, Int]`: the image metadata at row offset 0, the label at 16, rows of 24).

use super::*;

/// An image sample: (mode 0 jpg / 1 raw, width, height, bytes, label).
type Img<'a> = (u8, u16, u16, &'a [u8], i64);

/// A `.beton` of `samples` with a page size of 2^16 (the data after the metadata table).
fn beton(samples: &[Img]) -> Vec<u8> {
    let n = samples.len();
    let meta = 24 + 2 * FIELD_LEN;
    let data = meta + 24 * n;
    let mut body = Vec::new();
    let mut rows = Vec::new();
    let mut table = Vec::new();
    for (i, (mode, w, h, bytes, label)) in samples.iter().enumerate() {
        let ptr = (data + body.len()) as u64;
        body.extend_from_slice(bytes);
        let mut row = vec![*mode];
        row.extend_from_slice(&w.to_le_bytes());
        row.extend_from_slice(&h.to_le_bytes());
        row.extend_from_slice(&ptr.to_le_bytes());
        row.extend_from_slice(&[0; 3]);
        row.extend_from_slice(&label.to_le_bytes());
        rows.extend(row);
        for v in [i as u64, ptr, bytes.len() as u64] {
            table.extend_from_slice(&v.to_le_bytes());
        }
    }
    let alloc = (data + body.len()) as u64;
    let mut out = Vec::new();
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&(1u32 << 16).to_le_bytes());
    out.extend_from_slice(&(n as u64).to_le_bytes());
    out.extend_from_slice(&alloc.to_le_bytes());
    for (t, name) in [(2u8, "image"), (1u8, "label")] {
        let mut d = vec![0u8; FIELD_LEN];
        d[0] = t;
        d[1..1 + name.len()].copy_from_slice(name.as_bytes());
        out.extend(d);
    }
    out.extend(rows);
    out.extend(body);
    out.extend(table);
    out
}

fn file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("train.beton");
    std::fs::write(&p, bytes).unwrap();
    (d, p)
}

fn err(bytes: &[u8]) -> String {
    let (_d, p) = file(bytes);
    format!("{:#}", scan(&p).unwrap_err())
}

#[test]
fn the_row_layout_follows_numpy_alignment() {
    let b = beton(&[]);
    let l = layout(&b, 2).unwrap();
    assert_eq!(l.offsets, [0, 16]);
    assert_eq!(l.row_len, 24);
    assert_eq!(l.fields[0], (2, "image".to_string()));
}

#[test]
fn mixed_jpeg_and_raw_samples_are_found_in_place() {
    let jpg = b"\xff\xd8\xff\xe0jpeg\xff\xd9".as_slice();
    let raw = [9u8; 2 * 3 * 3];
    let b = beton(&[(0, 5, 5, jpg, 3), (1, 2, 3, &raw, -1)]);
    let (_d, p) = file(&b);
    let s = scan(&p).unwrap();
    assert!(sniff(&p).is_ok());
    assert_eq!(s.samples.len(), 2);
    let r = &s.samples[0].range;
    assert_eq!(&b[r.start as usize..r.end as usize], jpg);
    assert_eq!(s.samples[0].name, "00000000.jpg");
    assert_eq!(s.samples[0].pixels, None);
    assert_eq!(s.samples[0].label, Some(3));
    assert_eq!(s.samples[1].name, "00000001.ppm");
    assert_eq!(s.samples[1].pixels, Some((2, 3)));
    assert_eq!(s.samples[1].label, Some(-1));
    let r = &s.samples[1].range;
    assert_eq!(&b[r.start as usize..r.end as usize], &raw[..]);
    assert_eq!(s.fields, ["image:rgb_image", "label:int"]);
}

#[test]
fn damaged_headers_and_tables_are_refused_naming_the_file() {
    let good = beton(&[(0, 1, 1, b"\xff\xd8xy", 0)]);
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let meta = 24 + 2 * FIELD_LEN;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..20].to_vec(), "truncated header"),
        (with(0, &3u16.to_le_bytes()), "FFCV version 3"),
        (with(16, &0u64.to_le_bytes()), "did not finish"),
        (good[..100].to_vec(), "truncated field descriptors"),
        (with(24, &[255]), "custom"),
        (with(8, &u64::MAX.to_le_bytes()), "runs past the end"),
        (with(8, &(1u64 << 40).to_le_bytes()), "runs past the end"),
        (
            with(16, &u64::MAX.to_le_bytes()),
            "allocation table lies past the end",
        ),
        (with(meta, &[7]), "image mode 7"),
        // The image pointer moved off its allocation.
        (
            with(meta + 5, &1u64.to_le_bytes()),
            "not in the allocation table",
        ),
        // A raw image whose size does not match its allocation.
        (with(meta, &[1]), "needs 3 bytes"),
        (with(24, &[1]), "no RGBImageField"),
    ];
    for (bytes, want) in cases {
        let e = err(&bytes);
        assert!(e.contains("train.beton") && e.contains(want), "{want}: {e}");
    }
}

#[test]
fn an_allocation_past_the_end_of_the_file_is_refused_not_wrapped() {
    // Size 2^64-1 in the allocation table: ptr + size overflowed before it was checked.
    let mut b = beton(&[(0, 1, 1, b"\xff\xd8x", 0)]);
    let n = b.len();
    b[n - 8..].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = err(&b);
    assert!(e.contains("not in the allocation table"), "{e}");
    b[n - 8..].copy_from_slice(&1000u64.to_le_bytes());
    let e = err(&b);
    assert!(e.contains("not in the allocation table"), "{e}");
}

#[test]
fn headers_that_are_not_ffcv_are_not_sniffed() {
    let (_d, p) = file(b"\x02\x00\x01\x00\x00\x01\x00\x00");
    assert!(sniff(&p).is_err(), "page size 256 is below FFCV's minimum");
    let (_d, p) = file(b"short");
    assert!(sniff(&p).is_err());
    assert!(sniff(p.parent().unwrap()).is_err(), "a directory");
}
