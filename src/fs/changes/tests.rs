//! Changes of a real directory, noted by hand (the watcher's part is the last test): names
//! answered from the disk, late nodes bound to one version, late directories, the rescan.

use super::*;
use crate::catalog::DirEntry;
use crate::open::dir::LooseDir;
use crate::view::Views;
use std::time::Duration;

/// `d/a.bin` (4 bytes), `d/b.bin` (8), `e/c.bin` (1) under `root`.
fn tree(root: &Path) {
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(root.join("e")).unwrap();
    std::fs::write(root.join("d/a.bin"), b"aaaa").unwrap();
    std::fs::write(root.join("d/b.bin"), b"bbbbbbbb").unwrap();
    std::fs::write(root.join("e/c.bin"), b"c").unwrap();
}

fn changes_of(root: &Path) -> (Arc<Changes>, Arc<dyn Catalog>) {
    changes_with(root, Views::default())
}

/// The changes of `root` mounted showing `views`, and the catalog served.
pub(crate) fn changes_with(root: &Path, views: Views) -> (Arc<Changes>, Arc<dyn Catalog>) {
    let d = LooseDir::open(root, views.any(), crate::progress::Progress::None).unwrap();
    let cat: Arc<dyn Catalog> = Arc::new(d.catalog(views).unwrap());
    let raw = Arc::new(d.catalog(Views::default()).unwrap());
    let ch = Changes::new(d.root.clone(), cat.clone(), raw, d.storage());
    ch.snapshot_dirs();
    (Arc::new(ch), cat)
}

/// A 16×8 JPEG.
fn jpeg() -> Vec<u8> {
    let mut out = Vec::new();
    let px = vec![128u8; 16 * 8 * 3];
    (jpeg_encoder::Encoder::new(&mut out, 90))
        .encode(&px, 16, 8, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

/// The inode of `path` as the mount answers it (changes first, then the catalog).
fn ino(ch: &Changes, path: &str) -> Result<u64, FsError> {
    let mut at = crate::ino::ROOT_INO;
    for part in path.split('/') {
        at = ch.lookup_any(at, part.as_bytes())?.ino;
    }
    Ok(at)
}

/// Names listed in `dir` (after `.` and `..`) with their inodes, as the mount lists them.
fn listing(ch: &Changes, cat: &dyn Catalog, dir: u64) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut add = |e: DirEntry<'_>| {
        out.push((String::from_utf8_lossy(&e.name).into_owned(), e.ino));
        false
    };
    match ch.readdir(dir, 0, &mut add) {
        Some(r) => r.unwrap(),
        None => cat.readdir(dir, 0, &mut add).unwrap(),
    }
    out.drain(..2);
    out
}

fn late(ino: u64) -> u64 {
    match Node::of(ino) {
        Some(Node::Late(k)) => k,
        n => panic!("inode {ino} is {n:?}, not a late node"),
    }
}

#[test]
fn changed_names_are_answered_from_the_disk_and_the_rest_from_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, cat) = changes_of(root);
    let d = ino(&ch, "d").unwrap();
    let (a0, b0) = (ino(&ch, "d/a.bin").unwrap(), ino(&ch, "d/b.bin").unwrap());
    assert_eq!(
        ch.lookup(d, b"a.bin"),
        None,
        "nothing changed: the catalog answers"
    );
    assert!(ch.readdir(d, 0, &mut |_| false).is_none());

    std::fs::write(root.join("d/new.bin"), b"fresh").unwrap();
    std::fs::write(root.join("d/.a.tmp"), b"replaced!").unwrap();
    std::fs::rename(root.join("d/.a.tmp"), root.join("d/a.bin")).unwrap();
    std::fs::remove_file(root.join("d/b.bin")).unwrap();
    let noted = ch.note(d, b"a.bin");
    assert_eq!(
        noted.was,
        [a0, Node::Npy(a0 as u32 - 1).ino()],
        "the kernel is told which inodes went stale (the file's, its view's)"
    );
    for name in ["new.bin", ".a.tmp", "b.bin"] {
        ch.note(d, name.as_bytes());
    }
    // A name noted but unchanged on the disk keeps its catalog inode.
    ch.note(ino(&ch, "e").unwrap(), b"c.bin");
    assert_eq!(
        ino(&ch, "e/c.bin"),
        cat.lookup(ino(&ch, "e").unwrap(), b"c.bin").map(|a| a.ino)
    );

    let new = late(ino(&ch, "d/new.bin").unwrap());
    assert_eq!(ch.read_at(new, 0, 100).unwrap(), b"fresh");
    assert_eq!(ch.read_at(new, 2, 2).unwrap(), b"es");
    assert_eq!(ch.read_at(new, 9, 2).unwrap(), b"", "past the end");
    let a = late(ino(&ch, "d/a.bin").unwrap());
    assert_eq!(ch.getattr(a).unwrap().size, 9);
    assert_eq!(ch.read_at(a, 0, 100).unwrap(), b"replaced!");
    assert_eq!(ino(&ch, "d/b.bin"), Err(FsError::NotFound));
    assert_eq!(ino(&ch, "d/.a.tmp"), Err(FsError::NotFound));
    let names: Vec<_> = listing(&ch, &*cat, d).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["a.bin", "new.bin"],
        "sorted by name, the removed one gone"
    );
    assert_ne!(ino(&ch, "d/a.bin").unwrap(), a0);
    assert_ne!(ino(&ch, "d/a.bin").unwrap(), b0);
    assert_eq!(ch.stats.late_nodes.load(Relaxed), 2);
}

#[test]
fn a_late_file_answers_one_version_or_eio_and_is_dropped_once_forgotten() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, _) = changes_of(root);
    let d = ino(&ch, "d").unwrap();
    std::fs::write(root.join("d/x"), b"version one").unwrap();
    ch.note(d, b"x");
    let k1 = late(ino(&ch, "d/x").unwrap());
    assert_eq!(ch.read_at(k1, 0, 7).unwrap(), b"version");
    // Rewritten in place (same inode, other size): the first version's reader gets EIO, not
    // the new bytes after the old ones.
    std::fs::write(root.join("d/x"), b"version two, longer").unwrap();
    assert!(matches!(ch.read_at(k1, 7, 100), Err(FsError::Io(m)) if m.contains("d/x")));
    assert!(ch.open(k1).is_err());
    ch.note(d, b"x");
    let k2 = late(ino(&ch, "d/x").unwrap());
    assert_ne!(k1, k2);
    assert_eq!(ch.read_at(k2, 0, 100).unwrap(), b"version two, longer");
    // The same version looked up again is the same node.
    assert_eq!(late(ino(&ch, "d/x").unwrap()), k2);
    ch.forget(k1);
    ch.forget(k2);
    assert_eq!(
        ch.getattr(k1),
        Err(FsError::NotFound),
        "superseded: dropped"
    );
    assert!(ch.getattr(k2).is_ok(), "current: kept for the next lookup");
    assert_eq!(ch.stats.late_nodes.load(Relaxed), 1);
    assert_eq!(ch.open(k1).err(), Some(FsError::NotFound));
}

#[test]
fn a_directory_added_is_listed_from_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, cat) = changes_of(root);
    std::fs::create_dir_all(root.join("new dir/ü")).unwrap();
    std::fs::write(root.join("new dir/f"), b"ff").unwrap();
    std::os::unix::fs::symlink("f", root.join("new dir/link")).unwrap();
    ch.note(crate::ino::ROOT_INO, b"new dir");
    let dir = ino(&ch, "new dir").unwrap();
    assert_eq!(ch.getattr(late(dir)).unwrap().kind, Kind::Dir);
    let names: Vec<_> = listing(&ch, &*cat, dir)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["f", "ü"],
        "the link left out, as pack leaves it out"
    );
    assert_eq!(ch.lookup(dir, b".").unwrap().unwrap().ino, dir);
    assert_eq!(
        ch.lookup(dir, b"..").unwrap().unwrap().ino,
        crate::ino::ROOT_INO
    );
    let deeper = ino(&ch, "new dir/ü").unwrap();
    assert_eq!(ch.lookup(deeper, b"..").unwrap().unwrap().ino, dir);
    let f = late(ino(&ch, "new dir/f").unwrap());
    assert_eq!(ch.read_at(f, 0, 10).unwrap(), b"ff");
    assert_eq!(ch.open(late(dir)).err(), Some(FsError::IsDir));
    assert_eq!(ch.lookup(f | (1 << 60), b"x"), Some(Err(FsError::NotDir)));
    let root_names: Vec<_> = listing(&ch, &*cat, crate::ino::ROOT_INO);
    assert_eq!(
        root_names
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["d", "e", "new dir"]
    );
}

#[test]
fn a_rescan_notes_exactly_the_names_that_differ_from_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, _) = changes_of(root);
    assert_eq!(ch.rescan(), [], "nothing changed");
    std::fs::write(root.join("e/.t"), b"other").unwrap();
    std::fs::rename(root.join("e/.t"), root.join("e/c.bin")).unwrap();
    std::fs::remove_file(root.join("d/b.bin")).unwrap();
    std::fs::create_dir(root.join("d/sub")).unwrap();
    let mut got: Vec<String> = (ch.rescan().iter())
        .map(|n| String::from_utf8_lossy(&n.name).into_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["b.bin", "c.bin", "sub"]);
    assert_eq!(ch.stats.rescans.load(Relaxed), 2);
    assert_eq!(ino(&ch, "d/b.bin"), Err(FsError::NotFound));
    assert_eq!(
        ch.read_at(late(ino(&ch, "e/c.bin").unwrap()), 0, 9)
            .unwrap(),
        b"other"
    );
}

#[test]
fn the_watcher_notes_changes_and_watches_new_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, _) = changes_of(root);
    let d = ino(&ch, "d").unwrap();
    let (forget, rx) = crate::fs::watch::forget_to_channel();
    crate::fs::watch::start(ch.clone(), forget).unwrap();
    assert_eq!(ch.stats.watched.load(Relaxed), 3, "the root, d and e");
    // Waits for the note of `name` (events of other names, or the same name twice, may come).
    let noted = |name: &str| loop {
        let n = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no note of {name}: {e}"));
        if n.name == name.as_bytes() {
            return n;
        }
    };
    std::fs::write(root.join("d/w.bin"), b"www").unwrap();
    let n = noted("w.bin");
    assert_eq!((n.dir, n.was), (d, vec![]));
    assert_eq!(
        ch.read_at(late(ino(&ch, "d/w.bin").unwrap()), 0, 9)
            .unwrap(),
        b"www"
    );
    std::fs::create_dir(root.join("d/sub")).unwrap();
    assert!(
        noted("sub").was.is_empty(),
        "told at once, before it is watched"
    );
    let sub = ino(&ch, "d/sub").unwrap();
    assert_eq!(noted("sub").was, [sub], "told again once watched");
    std::fs::write(root.join("d/sub/z"), b"z").unwrap();
    let n = noted("z");
    assert_eq!(n.dir, sub, "a directory made later is watched");
    // A writer that keeps its descriptor open (an appending logger): its writes are seen
    // before it closes.
    let mut w = std::fs::File::create(root.join("d/open.bin")).unwrap();
    noted("open.bin");
    std::io::Write::write_all(&mut w, b"0123456789").unwrap();
    let k = loop {
        noted("open.bin");
        let k = late(ino(&ch, "d/open.bin").unwrap());
        if ch.getattr(k).unwrap().size == 10 {
            break k;
        }
    };
    assert_eq!(ch.read_at(k, 0, 64).unwrap(), b"0123456789");
    drop(w);
    std::fs::remove_file(root.join("d/a.bin")).unwrap();
    let n = noted("a.bin");
    assert!(!n.was.is_empty());
    assert_eq!(ino(&ch, "d/a.bin"), Err(FsError::NotFound));
}

#[test]
fn under_decoded_only_hidden_jpegs_stay_hidden_and_late_jpegs_are_not_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    std::fs::write(root.join("d/p.JPEG"), jpeg()).unwrap();
    let views = Views {
        npy: true,
        decoded_only: true,
        ..Views::default()
    };
    let (ch, cat) = changes_with(root, views);
    let d = ino(&ch, "d").unwrap();
    assert_eq!(ch.rescan(), [], "a JPEG the mount hides is no change");
    std::fs::write(root.join("d/q.JPEG"), jpeg()).unwrap();
    std::fs::write(root.join("d/q.txt"), b"text").unwrap();
    for name in ["p.JPEG", "q.JPEG", "q.txt"] {
        ch.note(d, name.as_bytes());
    }
    let names: Vec<_> = listing(&ch, &*cat, d).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a.bin", "b.bin", "p.npy", "q.txt"]);
    assert_eq!(ch.lookup(d, b"p.JPEG"), Some(Err(FsError::NotFound)));
    assert_eq!(ch.lookup(d, b"q.JPEG"), Some(Err(FsError::NotFound)));
    assert!(matches!(ch.lookup(d, b"q.txt"), Some(Ok(a)) if a.size == 4));
}

#[test]
fn the_snapshot_of_many_empty_files_is_found_by_path() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    // Empty files share their base in the storage object: found by path, not by base.
    for k in 0..300 {
        std::fs::write(root.join(format!("d/empty {k:03}")), b"").unwrap();
    }
    std::fs::write(root.join("d/zz"), b"z").unwrap();
    let (ch, _) = changes_of(root);
    assert_eq!(ch.rescan(), [], "nothing changed");
    let d = ino(&ch, "d").unwrap();
    let was = ino(&ch, "d/empty 150").unwrap();
    ch.note(d, b"empty 150");
    assert_eq!(
        ino(&ch, "d/empty 150").unwrap(),
        was,
        "unchanged: the catalog's inode"
    );
    std::fs::write(root.join("d/empty 151"), b"now full").unwrap();
    ch.note(d, b"empty 151");
    assert_eq!(
        ch.read_at(late(ino(&ch, "d/empty 151").unwrap()), 0, 99)
            .unwrap(),
        b"now full"
    );
}

#[test]
fn names_come_and_gone_are_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    tree(root);
    let (ch, cat) = changes_of(root);
    let d = ino(&ch, "d").unwrap();
    // A writer updating through temporary names: each appears, is looked up, and is renamed.
    for k in 0..50 {
        let t = format!(".tmp{k}");
        std::fs::write(root.join("d").join(&t), b"v").unwrap();
        ch.note(d, t.as_bytes());
        late(ino(&ch, &format!("d/{t}")).unwrap());
        std::fs::rename(root.join("d").join(&t), root.join("d/a.bin")).unwrap();
        ch.note(d, t.as_bytes());
        ch.note(d, b"a.bin");
        let a = late(ino(&ch, "d/a.bin").unwrap());
        assert_eq!(ch.read_at(a, 0, 9).unwrap(), b"v");
    }
    let st = ch.read();
    assert_eq!(st.changed[&d].len(), 1, "only a.bin stays changed");
    assert_eq!(st.by_path.len(), 1, "only a.bin has a current late node");
    drop(st);
    // Removed from the snapshot: it stays noted (the catalog would still answer it).
    std::fs::remove_file(root.join("d/b.bin")).unwrap();
    ch.note(d, b"b.bin");
    assert_eq!(ino(&ch, "d/b.bin"), Err(FsError::NotFound));
    let names: Vec<_> = listing(&ch, &*cat, d).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a.bin"]);
}

#[test]
fn a_directory_swapped_for_a_symbolic_link_is_never_read_through() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, outside) = (tmp.path().join("tree"), tmp.path().join("outside"));
    tree(&root);
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("a.bin"), b"secret").unwrap();
    std::fs::write(outside.join("new.bin"), b"secret too").unwrap();
    let (ch, _cat) = changes_of(&root);
    // A directory of the mount held (its inode known), the real one renamed away and a link
    // to a directory outside the tree put in its place; then names in it change.
    let d = ino(&ch, "d").unwrap();
    std::fs::rename(root.join("d"), root.join("d-away")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("d")).unwrap();
    for name in ["a.bin", "new.bin"] {
        ch.note(d, name.as_bytes());
    }
    ch.note(crate::ino::ROOT_INO, b"d");
    // Through the held directory: nothing outside the tree is found, listed or read.
    for name in ["a.bin", "new.bin"] {
        match ch.lookup_any(d, name.as_bytes()) {
            Err(_) => {}
            Ok(a) => {
                let got = ch.read_at(late(a.ino), 0, 100);
                assert!(
                    !matches!(&got, Ok(b) if b.starts_with(b"secret")),
                    "{name} read from outside the tree: {got:?}"
                );
            }
        }
    }
    let mut names = Vec::new();
    let _ = ch.readdir(d, 0, &mut |e| {
        names.push(e.name.into_owned());
        false
    });
    assert!(
        !names.iter().any(|n| n == b"new.bin"),
        "listed from outside"
    );
    // From the top: the link is no directory of the tree.
    assert!(ino(&ch, "d/new.bin").is_err());
}
