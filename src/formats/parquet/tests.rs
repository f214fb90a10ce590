//! Parquet scanning from files written here with the `parquet` crate's own writer, in the
//! shape Hugging Face `datasets` writes (`formats.md` §6): an `image` group of `bytes` and
//! `path`, an int64 `label`, the `huggingface` metadata naming the features.

use super::*;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::sync::Arc;

const SCHEMA: &str = "message schema {
  optional group image { optional binary bytes; optional binary path (STRING); }
  optional int64 label;
}";

fn hf_meta() -> String {
    serde_json::json!({"info": {"features": {
        "image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": ["cat", "dog"]},
    }}})
    .to_string()
}

/// A file of `groups` row groups of (image bytes, path, label); `plain` = uncompressed and
/// without a dictionary (served in place), else Snappy with a dictionary (a chunk per group).
fn write(path: &Path, groups: &[Vec<(&[u8], &str, i64)>], plain: bool, meta: Option<String>) {
    let props = WriterProperties::builder()
        .set_compression(if plain {
            Compression::UNCOMPRESSED
        } else {
            Compression::SNAPPY
        })
        .set_dictionary_enabled(!plain)
        .set_key_value_metadata(meta.map(|m| vec![KeyValue::new("huggingface".into(), m)]))
        .build();
    let schema = Arc::new(parse_message_type(SCHEMA).unwrap());
    let f = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(f, schema, Arc::new(props)).unwrap();
    for rows in groups {
        let mut g = w.next_row_group().unwrap();
        let defs = vec![2i16; rows.len()];
        let bytes: Vec<ByteArray> = rows.iter().map(|r| ByteArray::from(r.0.to_vec())).collect();
        let paths: Vec<ByteArray> = rows.iter().map(|r| ByteArray::from(r.1)).collect();
        let labels: Vec<i64> = rows.iter().map(|r| r.2).collect();
        for vals in [bytes, paths] {
            let mut c = g.next_column().unwrap().unwrap();
            c.typed::<ByteArrayType>()
                .write_batch(&vals, Some(&defs), None)
                .unwrap();
            c.close().unwrap();
        }
        let mut c = g.next_column().unwrap().unwrap();
        let d1 = vec![1i16; rows.len()];
        c.typed::<Int64Type>()
            .write_batch(&labels, Some(&d1), None)
            .unwrap();
        c.close().unwrap();
        g.close().unwrap();
    }
    w.close().unwrap();
}

fn rows() -> Vec<Vec<(&'static [u8], &'static str, i64)>> {
    vec![
        vec![
            (b"\xff\xd8first jpeg", "a/x.jpg", 0),
            (b"\x89PNG\r\n\x1a\nsecond", "", 1),
        ],
        vec![(b"\xff\xd8third", "z.jpg", 1)],
    ]
}

#[test]
fn plain_image_columns_are_served_in_place_with_names_and_classes() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("train-00000-of-00001.parquet");
    write(&p, &rows(), true, Some(hf_meta()));
    assert!(sniff(&p).is_ok() && sniff(d.path()).is_ok());
    let s = scan(d.path(), None).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(s.samples.len(), 3);
    assert_eq!(s.objects.len(), 1);
    for (x, want) in s.samples.iter().zip(rows().concat()) {
        assert_eq!(&bytes[x.range.start as usize..x.range.end as usize], want.0);
        assert_eq!(x.label, Some(want.2));
        assert_eq!(x.object, 0);
    }
    let names: Vec<_> = s.samples.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["x.jpg", "00000001.png", "z.jpg"]);
    assert_eq!(s.samples[1].class.as_deref(), Some("dog"));
    assert_eq!(s.fields, ["image.bytes", "image.path", "label"]);
}

#[test]
fn dictionary_row_groups_become_chunks_of_their_concatenated_images() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.parquet");
    write(&p, &rows(), false, Some(hf_meta()));
    let s = scan(&p, None).unwrap();
    assert_eq!(s.objects.len(), 3, "the file and one chunk per row group");
    let (g0, g1) = (s.chunks[1].as_ref().unwrap(), s.chunks[2].as_ref().unwrap());
    assert_eq!(g0.parquet, Some((0, "image".to_string())));
    assert_eq!(
        g0.len,
        (b"\xff\xd8first jpeg".len() + b"\x89PNG\r\n\x1a\nsecond".len()) as u64
    );
    assert_eq!(g1.parquet, Some((1, "image".to_string())));
    let objects: Vec<_> = s
        .samples
        .iter()
        .map(|x| (x.object, x.range.clone()))
        .collect();
    assert_eq!(objects, [(1, 0..12), (1, 12..26), (2, 0..7)]);
    // The chunk decodes to exactly those bytes.
    let out = g0.open(&p).unwrap().decompress().unwrap();
    assert_eq!(&out[12..26], b"\x89PNG\r\n\x1a\nsecond");
}

#[test]
fn a_label_column_given_by_name_is_read_without_class_names() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.parquet");
    let meta = serde_json::json!({"info": {"features": {"image": {"_type": "Image"}}}});
    write(&p, &rows(), true, Some(meta.to_string()));
    let s = scan(&p, None).unwrap();
    assert_eq!(s.samples[2].label, None);
    let s = scan(&p, Some("label")).unwrap();
    assert_eq!(s.samples[2].label, Some(1));
    assert_eq!(s.samples[2].class, None);
}

#[test]
fn files_without_features_or_damaged_are_refused_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.parquet");
    write(&p, &rows(), true, None);
    let e = format!("{:#}", scan(&p, None).unwrap_err());
    assert!(
        e.contains("t.parquet") && e.contains("no Image feature"),
        "{e}"
    );
    write(&p, &rows(), true, Some(hf_meta()));
    let good = std::fs::read(&p).unwrap();
    // Every single-byte flip of the footer and the pages: refused or read, never a panic out
    // of scan (the crate's own panics are caught), never a range outside the file.
    let q = d.path().join("flip.parquet");
    for at in (0..good.len()).step_by(7) {
        let mut b = good.clone();
        b[at] ^= 0x5a;
        std::fs::write(&q, &b).unwrap();
        match scan(&q, None) {
            Ok(s) => assert!(
                s.samples
                    .iter()
                    .all(|x| x.range.end <= b.len() as u64 || x.object > 0)
            ),
            Err(e) => assert!(
                format!("{e:#}").contains("flip.parquet"),
                "byte {at}: {e:#}"
            ),
        }
    }
    std::fs::write(&q, b"PAR1 not really PAR1").unwrap();
    let e = format!("{:#}", scan(&q, None).unwrap_err());
    assert!(e.contains("not a readable Parquet file"), "{e}");
    std::fs::write(&q, b"plain").unwrap();
    assert!(sniff(&q).is_err());
    let empty = tempfile::tempdir().unwrap();
    assert!(format!("{:#}", scan(empty.path(), None).unwrap_err()).contains("no .parquet files"));
}
