//! Documented flags and behaviours that had no test (issue 14; `tests/README.md` maps them):
//! `pack --jobs` (same pack whatever the thread count), `pack --json` (counts equal to the tree),
//! decode option conflicts (refused before mounting, exit 2), `info` and `stats` text output
//! (the same figures as their JSON), `st_blksize`, READDIRPLUS (a listing with attributes costs
//! no LOOKUP per entry), `isatty` on a file (ENOTTY, one IOCTL forwarded), a pack's mode (the
//! umask's, not 0600).

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::MetadataExt;

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn pack_jobs_gives_the_same_pack_and_json_counts_the_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let (a, b) = (tmp.path().join("a.pack"), tmp.path().join("b.pack"));
    let ra = json(&loosefs(&[&"pack", &src, &a, &"--jobs", &"1", &"--json"]));
    let rb = json(&loosefs(&[&"pack", &src, &b, &"--jobs", &"3", &"--json"]));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    // make_tree: 3 classes of 4 JPEGs, notes.txt, one nested JPEG; directories (the root not
    // counted): 3 classes, nested, deeper, empty_class.
    let files = files(&src);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(src.join(f)).unwrap().len())
        .sum();
    for r in [&ra, &rb] {
        assert_eq!(r["files"], 14, "{r}");
        assert_eq!(r["jpegs"], 13, "{r}");
        assert_eq!(r["dirs"], 6, "{r}");
        assert_eq!(r["bytes"], bytes, "{r}");
        assert_eq!(r["pack_bytes"], std::fs::metadata(&a).unwrap().len(), "{r}");
    }
    assert_eq!(files.len(), 14);
}

#[test]
fn decode_option_conflicts_are_refused_before_mounting() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let pack = tmp.path().join("t.pack");
    json(&loosefs(&[&"pack", &src, &pack, &"--json"]));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for (args, words) in [
        (vec!["--decoded-only"], "--decoded-only needs --decode npy"),
        (
            vec!["--decode", "ppm", "--decoded-only"],
            "--decoded-only needs --decode npy",
        ),
        (
            vec!["--decode-max-side", "64"],
            "--decode-max-side needs --decode",
        ),
        (
            vec!["--decode", "npy", "--decode-max-side", "0"],
            "at least 1",
        ),
    ] {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"mount", &pack, &mnt];
        for x in &args {
            a.push(x);
        }
        let o = loosefs(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(words), "{args:?}: {err}");
        assert!(!is_mounted(&mnt));
    }
}

#[test]
fn info_text_says_what_the_json_says() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let pack = tmp.path().join("t.pack");
    json(&loosefs(&[&"pack", &src, &pack, &"--json"]));
    let j = json(&loosefs(&[&"info", &pack, &"--json"]));
    let o = loosefs(&[&"info", &pack]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .to_string()
    };
    assert!(
        line("samples:").contains(&format!(
            "{} ({} JPEG, {} other)",
            j["samples"], j["jpeg_files"], j["other_files"]
        )),
        "{text}"
    );
    assert!(line("directories:").contains(&j["directories"].to_string()));
    assert!(line("sample bytes:").contains(&j["sample_bytes"].to_string()));
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn stats_text_blksize_readdirplus_and_isatty() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let pack = tmp.path().join("t.pack");
    json(&loosefs(&[&"pack", &src, &pack, &"--json"]));
    let m = mount(&pack, &tmp.path().join("mnt"), &[]);
    let stats = || json(&loosefs(&[&"stats", &m.mnt, &"--json"]));
    let lookups = || stats()["requests"]["lookup"].as_u64().unwrap();
    // A listing with attributes (ls -l) of a fresh directory: READDIRPLUS returns the
    // entries' attributes, so stat-ing every entry sends no LOOKUP per entry (the fixed
    // cost of the stats reads themselves is measured first).
    let l0 = lookups();
    let per_read = lookups() - l0;
    let l1 = lookups();
    let dir = m.mnt.join("class_0");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        std::fs::metadata(e.path()).unwrap();
        n += 1;
    }
    assert_eq!(n, 5);
    let l2 = lookups();
    assert!(
        l2 - l1 - per_read <= 1,
        "{} LOOKUPs for a listing of {n} entries with attributes",
        l2 - l1 - per_read
    );
    // st_blksize: 128 KiB, so Python's buffered reads fetch a sample in one request.
    assert_eq!(
        std::fs::metadata(dir.join("img_0.JPEG")).unwrap().blksize(),
        128 * 1024
    );
    // isatty on a sample: ENOTTY (not a terminal), one IOCTL forwarded and answered.
    let i0 = stats()["requests"]["ioctl"].as_u64().unwrap();
    let f = std::fs::File::open(dir.join("img_0.JPEG")).unwrap();
    // SAFETY: winsize is plain integers; all zeros is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which lives for the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::TIOCGWINSZ,
            &mut ws,
        )
    };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    assert!(stats()["requests"]["ioctl"].as_u64().unwrap() > i0);
    // Zero-message open: the first OPEN of the connection is answered ENOSYS and the kernel
    // sends no other, however many files are opened (each open would otherwise be a round trip).
    for _ in 0..2 {
        for e in std::fs::read_dir(&dir).unwrap() {
            std::fs::read(e.unwrap().path()).unwrap();
        }
    }
    assert_eq!(stats()["requests"]["open"].as_u64(), Some(1));
    // stats text: the same figures as the JSON.
    let s = stats();
    let o = loosefs(&[&"stats", &m.mnt]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("pid {}", s["daemon"]["pid"])),
        "{text}"
    );
    for key in ["daemon", "served", "page cache", "read-ahead"] {
        assert!(text.lines().any(|l| l.starts_with(key)), "{key}: {text}");
    }
}

#[test]
fn a_plain_directory_is_described_in_place_and_verify_refuses_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    // `info` of a directory describes what a mount of it serves in place (its mount is
    // tested in dir_mount.rs): 14 files, 13 of them JPEGs, and the directories.
    let o = loosefs(&[&"info", &src, &"--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["samples"], 14, "{v}");
    assert_eq!(v["jpeg_files"], 13, "{v}");
    let o = loosefs(&[&"info", &src]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("in place"));
    // `verify` checks packs only: a directory is named as one (it said "No such device").
    let o = loosefs(&[&"verify", &src]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("a directory, not a pack file") && err.contains("src"),
        "{err}"
    );
}

#[test]
fn pack_of_a_damaged_dataset_directory_is_refused_not_packed_as_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("mds");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("index.json"), b"{\"shards\": [").unwrap();
    std::fs::write(src.join("shard.00000.mds"), b"not a shard").unwrap();
    let out = tmp.path().join("o.pack");
    let o = loosefs(&[&"pack", &src, &out]);
    assert_eq!(o.status.code(), Some(65));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("looks like a dataset") && err.contains("mds: index.json"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn a_pack_gets_the_mode_the_umask_gives_a_new_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    for (umask, mode) in [("022", 0o644), ("027", 0o640), ("077", 0o600)] {
        let out = tmp.path().join(format!("u{umask}.pack"));
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" pack \"$1\" \"$2\""))
            .arg(bin())
            .arg(&src)
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = std::fs::metadata(&out).unwrap().mode() & 0o777;
        assert_eq!(got, mode, "umask {umask}: mode {got:o}");
    }
}

#[test]
fn a_pack_inflated_past_twice_its_files_by_alignment_says_so_and_how_to_avoid_it() {
    // 200 files of 64 bytes: at the default alignment (512) the pack is ~10x the files, said
    // once with the fix; at --align 1 nothing is left to leave out, and nothing is said.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..200 {
        std::fs::write(src.join("d").join(format!("f{i}.txt")), [b'x'; 64]).unwrap();
    }
    let o = loosefs(&[&"pack", &src, &tmp.path().join("a.pack")]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: the pack is") && err.contains("`--align 1` leaves out the padding"),
        "{err}"
    );
    let o = loosefs(&[&"pack", &src, &tmp.path().join("b.pack"), &"--align", &"1"]);
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
    // A tree of ordinary JPEGs: no warning.
    let jpegs = tmp.path().join("jpegs");
    make_tree(&jpegs);
    let o = loosefs(&[&"pack", &jpegs, &tmp.path().join("c.pack")]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
}
