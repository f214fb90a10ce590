//! FileSet over real files: layout, reads across files and padding, whole files for
//! passthrough, files changed under it, page-cache verbs.

use super::*;

/// Files of `sizes` bytes (file k filled with byte k + 1) laid out as a directory mount
/// lays them out: each at the next page boundary.
fn set(dir: &Path, sizes: &[usize]) -> FileSet {
    let mut files = Vec::new();
    let mut at = 0;
    for (k, &n) in sizes.iter().enumerate() {
        let rel = PathBuf::from(format!("d/f{k}"));
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join(&rel), vec![k as u8 + 1; n]).unwrap();
        let m = std::fs::metadata(dir.join(&rel)).unwrap();
        files.push(SetFile {
            rel,
            base: at,
            stamp: Stamp::of(&m),
        });
        at = (at + n as u64).next_multiple_of(PAGE);
    }
    FileSet::new(dir, files).unwrap()
}

#[test]
fn reads_span_files_and_padding_reads_as_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set(tmp.path(), &[5000, 0, 1, 4096, 10000]);
    let bases: Vec<u64> = s.files().iter().map(|f| f.base).collect();
    assert_eq!(bases, [0, 8192, 8192, 12288, 16384]);
    assert_eq!(s.len(0), 16384 + 12288);
    let mut all = vec![0xEE; s.len(0) as usize];
    s.read_at(0, 0, &mut all).unwrap();
    let mut want = vec![0u8; all.len()];
    for (k, f) in s.files().iter().enumerate() {
        let b = f.base as usize;
        want[b..b + f.stamp.len as usize].fill(k as u8 + 1);
    }
    assert!(all == want);
    // A read inside one file, and one past the end.
    let mut part = [0u8; 100];
    s.read_at(0, 16384 + 9000, &mut part).unwrap();
    assert_eq!(part, [5u8; 100]);
    assert!(s.read_at(0, s.len(0) - 10, &mut part).is_err());
    assert!(s.read_at(1, 0, &mut part).is_err(), "one object only");
}

#[test]
fn whole_files_are_found_by_base_and_length_empty_ones_too() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set(tmp.path(), &[5000, 0, 1]);
    assert_eq!(s.whole(&(0..5000)), Some(0));
    assert_eq!(s.whole(&(8192..8192)), Some(1));
    assert_eq!(s.whole(&(8192..8193)), Some(2));
    assert_eq!(s.whole(&(0..4096)), None, "part of a file");
    assert_eq!(s.whole(&(100..5000)), None);
    let f = s.backing_file(0, &(8192..8193)).unwrap().unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1);
    assert!(s.backing_file(0, &(1..5)).is_none());
}

#[test]
fn a_file_changed_replaced_or_removed_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set(tmp.path(), &[100, 200, 300, 400]);
    let mut b = [0u8; 10];
    for k in 0..4 {
        s.file(k).unwrap(); // kept open: later checks go through the path
    }
    let d = tmp.path().join("d");
    std::fs::write(d.join("f0"), [9u8; 150]).unwrap();
    let tmpf = d.join("new");
    std::fs::write(&tmpf, [2u8; 200]).unwrap();
    std::fs::rename(&tmpf, d.join("f1")).unwrap();
    std::fs::remove_file(d.join("f2")).unwrap();
    let e = s.read_at(0, 0, &mut b).unwrap_err().to_string();
    assert!(
        e.contains("d/f0 changed since the mount") && e.contains("100 bytes, now 150"),
        "{e}"
    );
    let e = s.read_at(0, 4096, &mut b).unwrap_err().to_string();
    assert!(e.contains("d/f1") && e.contains("replaced"), "{e}");
    let e = s.read_at(0, 8192, &mut b).unwrap_err().to_string();
    assert!(e.contains("d/f2 was removed"), "{e}");
    // The file nobody touched still reads.
    s.read_at(0, 12288, &mut b).unwrap();
    assert_eq!(b, [4u8; 10]);
    // A fresh set (nothing kept open) refuses the same way.
    let fresh = FileSet::new(tmp.path(), s.files().to_vec()).unwrap();
    assert!(
        fresh
            .read_at(0, 0, &mut b)
            .unwrap_err()
            .to_string()
            .contains("changed")
    );
    assert!(fresh.backing_file(0, &(4096..4296)).unwrap().is_err());
}

#[test]
fn misplaced_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set(tmp.path(), &[5000, 10]);
    let mut files = s.files().to_vec();
    files[1].base = 4096; // overlaps file 0
    assert!(FileSet::new(tmp.path(), files.clone()).is_err());
    files[1].base = 8193; // not on a page
    assert!(FileSet::new(tmp.path(), files).is_err());
}

#[test]
fn page_cache_verbs_reach_the_files() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set(tmp.path(), &[20000, 3000]);
    let all = 0..s.len(0);
    let mut b = vec![0u8; s.len(0) as usize];
    s.read_at(0, 0, &mut b).unwrap();
    // Just read (and just written): resident, as mincore of each file says.
    assert!(s.resident_bytes(0, &all) > 0);
    s.will_need(0, &all);
    s.release(0, &all).unwrap();
    s.evict(0, &all).unwrap();
    // A pin maps and locks each file's pages; they are then resident whatever happens.
    s.pin(0, &all).unwrap();
    assert!(s.resident(0, &all));
    assert_eq!(
        s.resident_bytes(0, &all),
        20000 + 3000,
        "file bytes, not padding"
    );
}

#[test]
fn a_warm_reads_the_files_in_the_order_of_their_first_block_on_the_device() {
    let tmp = tempfile::tempdir().unwrap();
    // Written last to first, each flushed: the file system places f5 first, f0 last.
    let sizes = [9000usize, 0, 20000, 4096, 70000, 100];
    for k in (0..sizes.len()).rev() {
        std::fs::create_dir_all(tmp.path().join("d")).unwrap();
        let p = tmp.path().join(format!("d/f{k}"));
        std::fs::write(&p, vec![k as u8 + 1; sizes[k]]).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
    }
    let mut files = Vec::new();
    let mut at = 0;
    for (k, &n) in sizes.iter().enumerate() {
        let rel = PathBuf::from(format!("d/f{k}"));
        let stamp = Stamp::of(&std::fs::metadata(tmp.path().join(&rel)).unwrap());
        files.push(SetFile {
            rel,
            base: at,
            stamp,
        });
        at = (at + n as u64).next_multiple_of(PAGE);
    }
    let s = FileSet::new(tmp.path(), files).unwrap();
    let first = |k: usize| {
        let f = std::fs::File::open(tmp.path().join(&s.files()[k].rel)).unwrap();
        fiemap::Fiemap::new(f)
            .next()
            .and_then(|e| e.ok())
            .map(|e| e.fe_physical)
    };
    let Some(order) = s.physical_order() else {
        assert!((0..sizes.len()).all(|k| first(k).is_none()));
        eprintln!(
            "skipped: the file system under {} gives no FIEMAP",
            tmp.path().display()
        );
        return;
    };
    let mut all = order.clone();
    all.sort_unstable();
    assert_eq!(all, (0..sizes.len()).collect::<Vec<_>>(), "each file once");
    let blocks: Vec<Option<u64>> = order.iter().map(|&k| first(k)).collect();
    assert!(
        blocks.windows(2).all(|w| w[0] <= w[1]),
        "{order:?}: {blocks:?}"
    );
    // The empty file has no block: first. The warm plan is the files' ranges in that order.
    assert_eq!(order[0], 1);
    let plan = s.warm_plan(0, s.len(0)).unwrap();
    let want: Vec<Range<u64>> = (order.iter().map(|&k| &s.files()[k]))
        .filter(|f| f.stamp.len > 0)
        .map(|f| f.base..f.base + f.stamp.len)
        .collect();
    assert_eq!(plan, want);
}

#[test]
fn a_fifo_in_a_files_place_is_refused_at_once_never_waited_on() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("x.JPEG");
    nix::unistd::mkfifo(
        &fifo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    // Without O_NONBLOCK this open would wait for a writer forever (no writer exists).
    let e = open_original(&fifo).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    std::fs::write(d.path().join("f"), b"x").unwrap();
    assert!(open_original(&d.path().join("f")).is_ok());
}
