//! Pack sources from real trees and archives made here: the directory walk's order and what
//! it leaves out, and zip archives with the names and entries `pack` must refuse or skip.

use super::*;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

fn names(s: &Source) -> Vec<String> {
    let full = |i: &Item| {
        let mut p = vec![i.name.clone()];
        let mut at = i.parent;
        while let Some(k) = at {
            p.push(s.items[k].name.clone());
            at = s.items[k].parent;
        }
        p.reverse();
        p.join("/")
    };
    s.items.iter().map(full).collect()
}

fn reasons(s: &Source) -> Vec<(String, String)> {
    let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
    s.skipped
        .iter()
        .map(|(p, why)| (name(p), why.clone()))
        .collect()
}

#[test]
fn a_tree_is_walked_depth_first_in_byte_order_leaving_out_what_cannot_be_packed() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for dir in ["b", "a", "a/B", "a/a", "empty"] {
        std::fs::create_dir_all(r.join(dir)).unwrap();
    }
    for f in ["b/x.jpg", "a/z.jpg", "a/B/1", "a/a/2", "Z.txt"] {
        std::fs::write(r.join(f), f).unwrap();
    }
    std::os::unix::fs::symlink(r.join("Z.txt"), r.join("link")).unwrap();
    nix::unistd::mkfifo(&r.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"bad\xff.jpg");
    std::fs::write(r.join(bad), b"x").unwrap();
    std::fs::write(r.join("out.pack"), b"").unwrap();
    let s = Source::open(
        r,
        &r.join("out.pack"),
        false,
        crate::progress::Progress::None,
    )
    .unwrap();
    assert_eq!(
        names(&s),
        [
            "Z.txt", "a", "a/B", "a/B/1", "a/a", "a/a/2", "a/z.jpg", "b", "b/x.jpg", "empty"
        ]
    );
    let why = reasons(&s);
    assert!(
        why.iter()
            .any(|(n, w)| n == "link" && w.contains("--follow-links")),
        "{why:?}"
    );
    assert!(
        why.iter()
            .any(|(n, w)| n == "fifo" && w.contains("special file")),
        "{why:?}"
    );
    assert!(why.iter().any(|(_, w)| w.contains("not UTF-8")), "{why:?}");
    assert!(
        why.iter()
            .any(|(n, w)| n == "out.pack" && w.contains("output pack")),
        "{why:?}"
    );
    let z = s.items.iter().find(|i| i.name == "Z.txt").unwrap();
    assert!(matches!(
        z.kind,
        ItemKind::File {
            size: 5,
            member: None
        }
    ));
    assert_eq!(s.read(z).unwrap(), b"Z.txt");
    // Followed, the link is a file with its target's bytes.
    let s = Source::open(
        r,
        &r.join("out.pack"),
        true,
        crate::progress::Progress::None,
    )
    .unwrap();
    assert!(names(&s).contains(&"link".to_string()));
}

#[test]
fn the_reserved_top_name_and_a_missing_source_are_refused() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join(RESERVED_ROOT_NAME)).unwrap();
    let e = format!(
        "{:#}",
        Source::open(
            d.path(),
            Path::new("o"),
            false,
            crate::progress::Progress::None
        )
        .err()
        .unwrap()
    );
    assert!(e.contains("reserved"), "{e}");
    let e = format!(
        "{:#}",
        Source::open(
            &d.path().join("nope"),
            Path::new("o"),
            false,
            crate::progress::Progress::None
        )
        .err()
        .unwrap()
    );
    assert!(
        e.contains("cannot read source") && e.contains("nope"),
        "{e}"
    );
}

#[test]
fn zip_member_names_resolve_lexically_or_are_refused_with_the_reason() {
    let ok = |n: &[u8]| crate::formats::zip::member_path(n).unwrap();
    assert_eq!(ok(b"train/n01/a.jpg"), ["train", "n01", "a.jpg"]);
    assert_eq!(ok(b"./a//b/./c"), ["a", "b", "c"]);
    assert_eq!(ok(b"a/../b"), ["b"]);
    assert!(ok(b"./").is_empty());
    for (n, want) in [
        (&b"../x"[..], "escape"),
        (b"a/../../x", "escape"),
        (b"/etc/passwd", "absolute"),
        (b"a\\b.jpg", "backslash"),
        (b"a\0b", "NUL"),
        (b"\xff.jpg", "UTF-8"),
    ] {
        let e = crate::formats::zip::member_path(n).unwrap_err();
        assert!(e.contains(want), "{n:?}: {e}");
    }
}

/// A zip of `members` (name, bytes; a name ending in `/` is a directory), stored.
fn zip_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in members {
        if let Some(d) = name.strip_suffix('/') {
            w.add_directory(d, opts).unwrap();
        } else {
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
    }
    w.finish().unwrap().into_inner()
}

fn open_zip(bytes: &[u8]) -> (tempfile::TempDir, Result<Source>) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("in.zip");
    std::fs::write(&p, bytes).unwrap();
    let s = Source::open(
        &p,
        &d.path().join("out.pack"),
        false,
        crate::progress::Progress::None,
    );
    (d, s)
}

#[test]
fn a_zip_becomes_its_tree_with_implied_directories() {
    let (_d, s) = open_zip(&zip_of(&[
        ("train/n02/b.jpg", b"bee"),
        ("train/n01/a.jpg", b"ay"),
        ("empty/", b""),
    ]));
    let s = s.unwrap();
    assert_eq!(
        names(&s),
        [
            "empty",
            "train",
            "train/n01",
            "train/n01/a.jpg",
            "train/n02",
            "train/n02/b.jpg"
        ]
    );
    let b = s.items.iter().find(|i| i.name == "b.jpg").unwrap();
    assert_eq!(s.read(b).unwrap(), b"bee");
    assert_eq!(b.meta.mode & 0o777, 0o644);
}

#[test]
fn zips_that_disagree_with_a_tree_are_refused_naming_the_member() {
    // Two members of one name: written as a.txt and b.txt, then renamed in both headers.
    let mut dup = zip_of(&[("a.txt", b"one"), ("b.txt", b"two")]);
    let at: Vec<usize> = (0..dup.len() - 5)
        .filter(|&i| &dup[i..i + 5] == b"b.txt")
        .collect();
    assert_eq!(at.len(), 2, "the local and the central header");
    for i in at {
        dup[i] = b'a';
    }
    for (bytes, want) in [
        (dup, "appears twice"),
        (
            zip_of(&[("a", b"file"), ("a/b", b"under a file")]),
            "both a file and a directory",
        ),
        (zip_of(&[("../up.jpg", b"x")]), "escape"),
        (zip_of(&[("dir\\x.jpg", b"x")]), "backslash"),
    ] {
        let (_d, s) = open_zip(&bytes);
        let e = format!("{:#}", s.err().unwrap());
        assert!(e.contains("in.zip") && e.contains(want), "{want}: {e}");
    }
}

#[test]
fn zip_mount_and_pack_refuse_the_same_archives() {
    // The encryption flag (general purpose bit 0) set in the local and central headers.
    let mut enc = zip_of(&[("a.jpg", b"secret")]);
    for i in 0..enc.len() - 4 {
        match &enc[i..i + 4] {
            b"PK\x03\x04" => enc[i + 6] |= 1,
            b"PK\x01\x02" => enc[i + 8] |= 1,
            _ => {}
        }
    }
    let mut bad_utf8 = zip_of(&[("a_.jpg", b"x")]);
    let at: Vec<usize> = (0..bad_utf8.len() - 6)
        .filter(|&i| &bad_utf8[i..i + 6] == b"a_.jpg")
        .collect();
    for i in at {
        bad_utf8[i + 1] = 0xff;
    }
    let cases = [
        (enc, "encrypted"),
        (bad_utf8, "UTF-8"),
        (zip_of(&[("dir\\x.jpg", b"x")]), "backslash"),
        (zip_of(&[("../up.jpg", b"x")]), "escape"),
    ];
    for (bytes, want) in cases {
        let (d, pack) = open_zip(&bytes);
        let pack = format!("{:#}", pack.err().expect("pack refuses"));
        let mount = crate::formats::zip::scan(&d.path().join("in.zip"));
        let mount = format!("{:#}", mount.expect_err("mount refuses"));
        for e in [pack, mount] {
            assert!(e.contains("in.zip") && e.contains(want), "{want}: {e}");
        }
    }
    // And they agree on a good archive: the same files.
    let (d, pack) = open_zip(&zip_of(&[("t/a.jpg", b"a"), ("b.jpg", b"b")]));
    let mount = crate::formats::zip::scan(&d.path().join("in.zip")).unwrap();
    let mut shown: Vec<String> = (mount.samples.iter())
        .map(|s| match s.dir.as_deref() {
            Some("") | None => s.name.clone(),
            Some(d) => format!("{d}/{}", s.name),
        })
        .collect();
    shown.sort();
    let pack = pack.unwrap();
    let mut files: Vec<String> = names(&pack)
        .into_iter()
        .zip(&pack.items)
        .filter(|(_, i)| matches!(i.kind, ItemKind::File { .. }))
        .map(|(n, _)| n)
        .collect();
    files.sort();
    assert_eq!(shown, files);
}
