//! A loose dataset directory mounted in place (root and /dev/fuse; `#[ignore]`d otherwise):
//! the tree and bytes of the originals, FUSE passthrough (no READ reaches the daemon) and the
//! daemon's own reads, files added, changed and removed while mounted, decoded views equal to a pack mount's,
//! and warm, pin and drop-cache acting on the original files.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The residency test empties every cache of the machine (`drop_caches`): it runs alone.
static SERIAL: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn stats(mnt: &Path) -> Value {
    let o = loosefs(&[&"stats", &mnt, &"--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn requests(s: &Value, op: &str) -> u64 {
    s["requests"][op].as_u64().unwrap_or(0)
}

/// [`make_tree`] plus what a directory mount must handle: a name with a space and UTF-8, a
/// 0-byte file, a deeper empty directory, and a symbolic link and a FIFO (left out, as `pack`
/// leaves them out).
fn edge_tree(dir: &Path) -> PathBuf {
    make_tree(dir);
    let odd = dir.join("class 3 ü");
    std::fs::create_dir_all(odd.join("empty/deeper")).unwrap();
    std::fs::write(
        odd.join("ñame with space.JPEG"),
        encode_jpeg(40, 30, false, 7),
    )
    .unwrap();
    std::fs::write(odd.join("zero.bin"), b"").unwrap();
    std::os::unix::fs::symlink("../class_0/img_0.JPEG", odd.join("link.JPEG")).unwrap();
    nix::unistd::mkfifo(&odd.join("fifo"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    dir.to_path_buf()
}

/// What the tests that share the machine's caches start with: the mount check and timeout, a
/// shared hold on [`SERIAL`], and an [`edge_tree`] in a new temporary directory (with it).
fn edge_setup() -> (
    Timeout,
    std::sync::RwLockReadGuard<'static, ()>,
    tempfile::TempDir,
    PathBuf,
) {
    let timeout = require_mount();
    let shared = SERIAL.read().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let src = edge_tree(&tmp.path().join("src"));
    (timeout, shared, tmp, src)
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Every regular file of `src` reads the same through `mnt`, with the same size, mtime and
/// mode minus write bits; links and special files are not there.
fn same_tree(src: &Path, mnt: &Path) -> usize {
    let names = files(src);
    assert_eq!(files(mnt), names, "the same files in the same order");
    for f in &names {
        let (a, b) = (
            std::fs::metadata(src.join(f)).unwrap(),
            std::fs::metadata(mnt.join(f)).unwrap(),
        );
        assert_eq!(b.len(), a.len(), "{f}: size");
        assert_eq!(
            (b.mtime(), b.mtime_nsec()),
            (a.mtime(), a.mtime_nsec()),
            "{f}: mtime"
        );
        assert_eq!(
            b.mode() & 0o7777,
            a.mode() & 0o7555,
            "{f}: mode minus write bits"
        );
        assert!(
            std::fs::read(mnt.join(f)).unwrap() == std::fs::read(src.join(f)).unwrap(),
            "{f}: bytes"
        );
    }
    let odd = mnt.join("class 3 ü");
    assert!(odd.join("empty/deeper").is_dir());
    for left_out in ["link.JPEG", "fifo"] {
        assert_eq!(
            errno_of(std::fs::symlink_metadata(odd.join(left_out))),
            Some(libc::ENOENT),
            "{left_out}"
        );
    }
    names.len()
}

/// Changes `src` while mounted at `mnt` — a file rewritten in place, one replaced by a rename,
/// one removed, one added, a directory added with a file — after every file was read once
/// (the kernel holds their pages). Once the mount shows each change, the tree is the disk's
/// (names, sizes, mtimes, bytes), the other files read as before, and a handle opened on the
/// replaced file before its change reads its first version whole or fails with EIO: never
/// the two versions mixed.
fn changes_are_seen_never_mixed(src: &Path, mnt: &Path) {
    same_tree(src, mnt);
    let rewritten = "class_0/img_1.JPEG";
    let replaced = "class_1/img_0.JPEG";
    let removed = "class_2/img_0.JPEG";
    let added = "class_0/added.JPEG";
    let deep = "class 9/new/img.JPEG";
    let first = std::fs::read(src.join(replaced)).unwrap();
    let mut held = std::fs::File::open(mnt.join(replaced)).unwrap();
    std::fs::write(src.join(rewritten), encode_jpeg(90, 90, false, 1234)).unwrap();
    let tmp = src.join("class_1/.tmp");
    std::fs::write(&tmp, encode_jpeg(64, 48, false, 99)).unwrap();
    std::fs::rename(&tmp, src.join(replaced)).unwrap();
    std::fs::remove_file(src.join(removed)).unwrap();
    std::fs::write(src.join(added), encode_jpeg(20, 20, false, 5)).unwrap();
    std::fs::create_dir_all(src.join("class 9/new")).unwrap();
    std::fs::write(src.join(deep), encode_jpeg(30, 20, true, 6)).unwrap();
    for f in [rewritten, replaced, added, deep] {
        let want = std::fs::read(src.join(f)).unwrap();
        wait_until(f, 30, || {
            std::fs::read(mnt.join(f)).is_ok_and(|b| b == want)
        });
    }
    wait_until(removed, 30, || {
        errno_of(std::fs::metadata(mnt.join(removed))) == Some(libc::ENOENT)
    });
    same_tree(src, mnt);
    let mut got = Vec::new();
    match std::io::Read::read_to_end(&mut held, &mut got) {
        Ok(_) => assert!(
            got == first,
            "a handle opened before the change: its version whole"
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    let c = &stats(mnt)["changes"];
    assert!(c["events"].as_u64().unwrap() >= 5, "{c}");
    assert!(c["late_nodes"].as_u64().unwrap() >= 5, "{c}");
    assert!(c["watched_dirs"].as_u64().unwrap() >= 7, "{c}");
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_directory_mounts_in_place_through_passthrough() {
    let (_timeout, _shared, tmp, src) = edge_setup();
    let m = mount(&src, &tmp.path().join("mnt"), &["--passthrough", "on"]);
    let s0 = stats(&m.mnt);
    assert_eq!(s0["pack"]["reads"], "passthrough", "{s0}");
    let n = same_tree(&src, &m.mnt);
    // A mapping of a file reads the original too (DALI's file reader maps its files).
    let f = std::fs::File::open(m.mnt.join("class_0/img_2.JPEG")).unwrap();
    // SAFETY: a read-only map of a file nobody writes while it lives.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    assert!(map[..] == std::fs::read(src.join("class_0/img_2.JPEG")).unwrap()[..]);
    drop(map);
    // Concurrent opens of one file while another is held (DataLoader workers on a shared
    // sample): the kernel takes one backing file per inode, so they share it.
    std::thread::scope(|t| {
        for _ in 0..8 {
            t.spawn(|| {
                for _ in 0..50 {
                    let got = std::fs::read(m.mnt.join("class_0/img_2.JPEG")).unwrap();
                    assert!(got == std::fs::read(src.join("class_0/img_2.JPEG")).unwrap());
                }
            });
        }
    });
    drop(f);
    // The kernel read every file from its original: no READ reached the daemon, one OPEN per
    // file did (the price of passthrough).
    let s = stats(&m.mnt);
    assert_eq!(requests(&s, "read"), 0, "{s}");
    assert!(requests(&s, "open") > n as u64, "{s}");
    changes_are_seen_never_mixed(&src, &m.mnt);
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_directory_mounts_in_place_with_the_daemons_reads() {
    let (_timeout, _shared, tmp, src) = edge_setup();
    // The default: the daemon reads.
    let m = mount(&src, &tmp.path().join("mnt"), &[]);
    let s = stats(&m.mnt);
    assert_eq!(s["pack"]["reads"], "daemon", "{s}");
    changes_are_seen_never_mixed(&src, &m.mnt);
    drop(m);
    let m = mount(&src, &tmp.path().join("mnt2"), &["--passthrough", "off"]);
    assert_eq!(stats(&m.mnt)["pack"]["reads"], "daemon");
    same_tree(&src, &m.mnt);
    let s = stats(&m.mnt);
    assert!(requests(&s, "read") > 0, "the daemon served READs: {s}");
    assert_eq!(s["errors"], 0, "{s}");
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn views_of_a_directory_mount_equal_those_of_its_pack() {
    let (_timeout, _shared, tmp, src) = edge_setup();
    let pack = tmp.path().join("src.pack");
    let o = loosefs(&[&"pack", &src, &pack]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (k, flags) in [
        vec!["--decode", "npy"],
        vec!["--decode", "npy", "--decoded-only"],
        vec!["--decode", "ppm"],
    ]
    .iter()
    .enumerate()
    {
        let a = mount(&pack, &tmp.path().join(format!("pack{k}")), flags);
        let b = mount(&src, &tmp.path().join(format!("dir{k}")), flags);
        let names = files(&a.mnt);
        assert_eq!(files(&b.mnt), names, "{flags:?}");
        assert!(names.iter().any(|n| n.ends_with(".npy")) || flags.contains(&"ppm"));
        for f in &names {
            assert!(
                std::fs::read(b.mnt.join(f)).unwrap() == std::fs::read(a.mnt.join(f)).unwrap(),
                "{flags:?} {f}"
            );
        }
        if flags.contains(&"ppm") {
            let ppm = std::fs::read(b.mnt.join("class_0/img_0.JPEG")).unwrap();
            assert!(ppm.starts_with(b"P6\n"), "{flags:?}");
        }
    }
}

/// Bytes of file `p` in the page cache (mincore of a shared mapping; mapping reads nothing).
fn resident(p: &Path) -> u64 {
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    // SAFETY: a read-only map of a file nobody writes; only mincore looks at it.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range is the live mapping and `v` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore {}", p.display());
    v.iter().filter(|b| *b & 1 != 0).count() as u64 * 4096
}

fn resident_all(src: &Path) -> (u64, u64) {
    let names = files(src);
    let held = names.iter().map(|f| resident(&src.join(f))).sum();
    let total = names
        .iter()
        .map(|f| {
            std::fs::metadata(src.join(f))
                .unwrap()
                .len()
                .next_multiple_of(4096)
        })
        .sum();
    (held, total)
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn warm_pin_and_drop_cache_act_on_the_original_files() {
    let _timeout = require_mount();
    let _alone = SERIAL.write().unwrap_or_else(|p| p.into_inner());
    let tmp = disk_tempdir();
    let src = tmp.path().join("src");
    make_tree(&src);
    // Dirty pages survive POSIX_FADV_DONTNEED: the new files are written back first.
    std::process::Command::new("sync").status().unwrap();
    // Passthrough: the pass reads the originals, which stay cached.
    let m = mount(&src, &tmp.path().join("mnt"), &["--passthrough", "on"]);
    same_tree_bytes(&src, &m.mnt);
    let (held, total) = resident_all(&src);
    assert!(
        held >= total / 10 * 9,
        "{held} of {total} bytes resident after a pass"
    );
    // drop-cache evicts the originals' pages (nocache-style cold reads of a directory).
    let o = loosefs(&[&"drop-cache", &m.mnt]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(resident_all(&src).0, 0, "resident after drop-cache");
    // warm brings them back (90%: this kind of machine's DAMON pageout may take some back).
    let o = loosefs(&[&"warm", &m.mnt, &"--wait"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The warm read every file (in the order of their blocks on the disk), no padding.
    let w = &stats(&m.mnt)["warm"];
    let bytes: u64 = (files(&src).iter())
        .map(|f| std::fs::metadata(src.join(f)).unwrap().len())
        .sum();
    assert_eq!(
        (&w["state"], &w["bytes_done"]),
        (&"done".into(), &bytes.into()),
        "{w}"
    );
    assert_eq!(w["bytes_total"], bytes, "{w}");
    let (held, total) = resident_all(&src);
    assert!(
        held >= total / 10 * 9,
        "{held} of {total} bytes resident after warm"
    );
    drop(m);
    // A pin holds them through the kernel's own drop_caches.
    let m = mount(&src, &tmp.path().join("mnt2"), &["--pin", "all", "--wait"]);
    let s = stats(&m.mnt);
    assert_eq!(s["pin"]["pinned_bytes"], s["pin"]["target_bytes"], "{s}");
    std::process::Command::new("sync").status().unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches (root)");
    let (held, total) = resident_all(&src);
    assert_eq!(held, total, "pinned files resident after drop_caches");
    same_tree_bytes(&src, &m.mnt);
}

fn same_tree_bytes(src: &Path, mnt: &Path) {
    for f in files(src) {
        assert!(
            std::fs::read(mnt.join(&f)).unwrap() == std::fs::read(src.join(&f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn allow_other_never_shows_a_file_of_another_owner_as_the_tree_owners() {
    let _timeout = require_mount();
    let _r = SERIAL.read().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tree");
    make_tree(&src);
    // A file of another owner (root-only, as a secret a user's tree might hold).
    let secret = src.join("class_0/secret.txt");
    std::fs::write(&secret, b"root only\n").unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    std::os::unix::fs::chown(&src, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw())).unwrap();
    for e in walkdir::WalkDir::new(&src).min_depth(1) {
        let p = e.unwrap().into_path();
        if p != secret {
            std::os::unix::fs::lchown(&p, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw()))
                .unwrap();
        }
    }
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // With --allow-other the tree is refused, naming the file; without, it mounts (only its
    // mounter, root, can use the mount).
    let mnt = tmp.path().join("mnt-other");
    std::fs::create_dir(&mnt).unwrap();
    let o = loosefs(&[&"mount", &src, &mnt, &"--allow-other"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mounted: {err}");
    assert!(
        err.contains("secret.txt") && err.contains("--allow-other"),
        "{err}"
    );
    assert!(!is_mounted(&mnt), "a refusal leaves nothing mounted");
    drop(mount(&src, &tmp.path().join("mnt-own"), &[]));
    // A uniform tree mounts with --allow-other; a file of another owner added while mounted
    // is not served (ENOENT), one of the tree's owner is.
    std::fs::remove_file(&secret).unwrap();
    let m = mount(&src, &tmp.path().join("mnt"), &["--allow-other"]);
    std::fs::write(&secret, b"root only\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // Written, given to the owner, then renamed in: the mount sees it whole and owned.
    let tmp_mine = tmp.path().join("mine.tmp");
    std::fs::write(&tmp_mine, b"the owner's\n").unwrap();
    std::os::unix::fs::chown(
        &tmp_mine,
        Some(nobody.uid.as_raw()),
        Some(nobody.gid.as_raw()),
    )
    .unwrap();
    std::fs::rename(&tmp_mine, src.join("class_0/mine.txt")).unwrap();
    wait_until("the owner's late file served", 30, || {
        std::fs::read(m.mnt.join("class_0/mine.txt")).is_ok_and(|b| b == b"the owner's\n")
    });
    assert_eq!(
        errno_of(std::fs::read(m.mnt.join("class_0/secret.txt"))),
        Some(libc::ENOENT)
    );
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_watched_directory_renamed_inside_the_tree_keeps_its_changes_seen() {
    let (_timeout, _shared, tmp, src) = edge_setup();
    let m = mount(&src, &tmp.path().join("mnt"), &[]);
    same_tree(&src, &m.mnt);
    std::fs::rename(src.join("class_2"), src.join("class_2_moved")).unwrap();
    wait_until("the renamed directory", 30, || {
        errno_of(std::fs::metadata(m.mnt.join("class_2"))) == Some(libc::ENOENT)
            && m.mnt.join("class_2_moved").is_dir()
    });
    // Changes inside the renamed directory, and in a directory made inside it afterwards,
    // are seen: its watch follows it.
    let added = "class_2_moved/added.JPEG";
    std::fs::write(src.join(added), encode_jpeg(20, 20, false, 7)).unwrap();
    std::fs::create_dir(src.join("class_2_moved/deeper")).unwrap();
    let deep = "class_2_moved/deeper/img.JPEG";
    std::fs::write(src.join(deep), encode_jpeg(30, 20, false, 8)).unwrap();
    for f in [added, deep] {
        let want = std::fs::read(src.join(f)).unwrap();
        wait_until(f, 30, || {
            std::fs::read(m.mnt.join(f)).is_ok_and(|b| b == want)
        });
    }
    let later = "class_2_moved/deeper/later.JPEG";
    std::fs::write(src.join(later), encode_jpeg(10, 10, false, 9)).unwrap();
    let want = std::fs::read(src.join(later)).unwrap();
    wait_until(later, 30, || {
        std::fs::read(m.mnt.join(later)).is_ok_and(|b| b == want)
    });
    same_tree(&src, &m.mnt);
}

/// `fs.inotify.max_queued_events` set low for the mount's inotify instance (the kernel reads
/// it when the instance is made), then put back.
struct QueueLimit(String);

impl QueueLimit {
    const PATH: &'static str = "/proc/sys/fs/inotify/max_queued_events";

    fn set(n: u32) -> QueueLimit {
        let was = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, n.to_string()).unwrap();
        QueueLimit(was)
    }
}

impl Drop for QueueLimit {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, self.0.trim());
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn changes_faster_than_the_watch_reads_them_overflow_its_queue_and_are_seen_by_a_rescan() {
    let _timeout = require_mount();
    // Alone: the low queue limit applies to every inotify instance made meanwhile.
    let _alone = SERIAL.write().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let src = edge_tree(&tmp.path().join("src"));
    let m = {
        let _limit = QueueLimit::set(16);
        mount(&src, &tmp.path().join("mnt"), &[])
    };
    same_tree(&src, &m.mnt);
    let changes = |k: &str| stats(&m.mnt)["changes"][k].as_u64().unwrap();
    // A new directory, watched once the watcher has seen it.
    let watched = changes("watched_dirs");
    let burst = src.join("burst");
    std::fs::create_dir(&burst).unwrap();
    wait_until("the new directory watched", 30, || {
        changes("watched_dirs") > watched
    });
    let before = changes("rescans");
    // The daemon stopped (nothing reads its queue; the mount is not touched meanwhile) while
    // 400 files are written in it and 100 of them removed again: far more events than 16, so
    // the queue overflows whatever the scheduler does.
    let daemon = nix::unistd::Pid::from_raw(m.pid);
    nix::sys::signal::kill(daemon, nix::sys::signal::Signal::SIGSTOP).unwrap();
    for k in 0..400 {
        std::fs::write(burst.join(format!("f{k:03}.bin")), format!("{k}")).unwrap();
    }
    for k in (0..400).step_by(4) {
        std::fs::remove_file(burst.join(format!("f{k:03}.bin"))).unwrap();
    }
    nix::sys::signal::kill(daemon, nix::sys::signal::Signal::SIGCONT).unwrap();
    wait_until("a rescan after the overflow", 60, || {
        changes("rescans") > before
    });
    wait_until("the burst, as the disk has it", 60, || {
        std::fs::read_dir(m.mnt.join("burst")).is_ok_and(|d| d.count() == 300)
    });
    for k in (1..400).filter(|k| k % 4 != 0) {
        let f = format!("burst/f{k:03}.bin");
        assert_eq!(
            std::fs::read(m.mnt.join(&f)).unwrap(),
            format!("{k}").as_bytes(),
            "{f}"
        );
    }
    assert_eq!(
        errno_of(std::fs::metadata(m.mnt.join("burst/f000.bin"))),
        Some(libc::ENOENT)
    );
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("came faster than they were read"), "{log}");
}
