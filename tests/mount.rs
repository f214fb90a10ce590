//! Real mounts (root and /dev/fuse needed; `#[ignore]`d otherwise, and run by scripts/test.sh
//! with `--include-ignored` where they can run): the mounted tree equals the source, writes
//! fail with EROFS, every way of unmounting leaves no mount and no daemon behind, stale mounts
//! are reported with the fix, bad packs and mountpoints are refused, damaged samples answer EIO.

mod common;

use common::*;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Seconds a test waits for a daemon to exit: longer than the daemon's own wait for its
/// session thread (10 s) plus its shutdown, so the two limits never race.
const DAEMON_EXIT: u64 = 30;

/// `loosefs umount` as a command line.
const LOOSEFS_UMOUNT: [&str; 2] = [env!("CARGO_BIN_EXE_loosefs"), "umount"];

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn an_order_written_to_the_mount_is_read_ahead_and_its_files_served_identical() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let m = mount(&pack, &tmp.path().join("mnt"), &[]);
    let mut names = files(&src);
    shuffle(&mut names, 12345);
    // As Python's open(p, "w").write(...) does it: O_TRUNC, then the lines.
    let text: String = names.iter().map(|n| format!("{n}\n")).collect();
    std::fs::write(m.mnt.join(".loosefs/order"), &text).unwrap();
    let stats = |m: &Mounted| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(m.mnt.join(".loosefs/stats")).unwrap()).unwrap()
    };
    let o = &stats(&m)["order"];
    assert_eq!(
        (o["announced"].as_u64(), o["samples"].as_u64()),
        (Some(1), Some(names.len() as u64)),
        "{o}"
    );
    for n in &names {
        assert!(
            std::fs::read(m.mnt.join(n)).unwrap() == std::fs::read(src.join(n)).unwrap(),
            "{n}"
        );
    }
    let o = &stats(&m)["order"];
    assert_eq!(o["served"].as_u64(), Some(names.len() as u64), "{o}");
    assert_eq!(
        (o["left"].as_u64(), o["abandoned"].as_u64()),
        (Some(0), Some(0)),
        "{o}"
    );
    // The order file reads back the same section.
    let again: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.mnt.join(".loosefs/order")).unwrap()).unwrap();
    assert_eq!(again["served"], o["served"]);
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn mounted_tree_equals_source() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    // The real sample (read-only files, one level of classes) and a generated tree with what
    // it lacks: a nested directory, an empty one, a non-JPEG, files with write bits (0644).
    let (src, pack) = packed(tmp.path());
    let generated = tmp.path().join("generated-tree");
    make_tree(&generated);
    let f = generated.join("class_0/notes.txt");
    assert_eq!(
        std::fs::metadata(&f).unwrap().mode() & 0o200,
        0o200,
        "{}",
        f.display()
    );
    let gen_pack = tmp.path().join("generated.pack");
    let o = loosefs(&[&"pack", &generated, &gen_pack]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (k, (src, pack)) in [(src, pack), (generated, gen_pack)].into_iter().enumerate() {
        tree_matches(&src, &pack, &tmp.path().join(format!("mnt{k}")));
    }
}

/// Mounts `pack` at `mnt` and checks it shows `src` (names, types, modes minus write bits,
/// mtimes, sizes, bytes), refuses writes, caches negative lookups, and unmounts cleanly.
fn tree_matches(src: &Path, pack: &Path, mnt: &Path) {
    let (src, pack) = (src.to_path_buf(), pack.to_path_buf());
    let m = mount(&pack, mnt, &[]);
    let walk = |root: &Path| -> Vec<(String, walkdir::DirEntry)> {
        walkdir::WalkDir::new(root)
            .sort_by_file_name()
            .min_depth(1)
            .into_iter()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.path()
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    e,
                )
            })
            .collect()
    };
    let (a, b) = (walk(&src), walk(&m.mnt));
    let names =
        |v: &[(String, walkdir::DirEntry)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&b), names(&a), "os.walk-style traversal matches");
    let mut files = 0;
    for ((path, ea), (_, eb)) in a.iter().zip(&b) {
        let (sa, sb) = (ea.metadata().unwrap(), eb.metadata().unwrap());
        assert_eq!(ea.file_type().is_dir(), eb.file_type().is_dir(), "{path}");
        assert_eq!(
            sb.mode() & 0o7777,
            sa.mode() & 0o7555,
            "{path}: mode minus write bits"
        );
        assert_eq!(
            sb.mode() & libc::S_IFMT,
            sa.mode() & libc::S_IFMT,
            "{path}: file type"
        );
        assert_eq!(
            (sb.mtime(), sb.mtime_nsec()),
            (sa.mtime(), sa.mtime_nsec()),
            "{path}: mtime"
        );
        if ea.file_type().is_file() {
            files += 1;
            assert_eq!(sb.len(), sa.len(), "{path}: size");
            assert_eq!(
                sb.blocks(),
                sa.len().div_ceil(4096) * 8,
                "{path}: st_blocks"
            );
            assert_eq!(
                std::fs::read(eb.path()).unwrap(),
                std::fs::read(ea.path()).unwrap(),
                "{path}: bytes"
            );
        }
    }
    assert!(files > 0);
    // The index member is not part of the tree, by listing or by name.
    assert!(!m.mnt.join(".loosefs-index").exists());
    // Empty directories are listed and empty.
    for (path, e) in &a {
        if e.file_type().is_dir() && std::fs::read_dir(e.path()).unwrap().next().is_none() {
            assert_eq!(
                std::fs::read_dir(m.mnt.join(path)).unwrap().count(),
                0,
                "{path}"
            );
        }
    }
    // Missing names: ENOENT, and the second time from the kernel's negative entry cache: no
    // second LOOKUP reaches the daemon.
    // (Reading the stats file costs LOOKUPs of its own: measured first, then subtracted.)
    let lookups = |mnt: &Path| -> u64 {
        let v: serde_json::Value = loosefs::client::read_control(mnt, "stats").unwrap();
        v["requests"]["lookup"].as_u64().unwrap()
    };
    let l0 = lookups(&m.mnt);
    let per_read = lookups(&m.mnt) - l0;
    let l1 = lookups(&m.mnt);
    assert_eq!(
        errno_of(std::fs::metadata(m.mnt.join("no-such-class"))),
        Some(libc::ENOENT)
    );
    let l2 = lookups(&m.mnt);
    assert_eq!(
        l2 - l1,
        per_read + 1,
        "the first missing lookup reaches the daemon"
    );
    assert_eq!(
        errno_of(std::fs::metadata(m.mnt.join("no-such-class"))),
        Some(libc::ENOENT)
    );
    let l3 = lookups(&m.mnt);
    assert_eq!(
        l3 - l2,
        per_read,
        "a second LOOKUP for a cached missing name"
    );
    // Writes of every kind fail with EROFS. The mount answers no OPEN (zero-message open),
    // so an open for writing succeeds, and its first write fails; a truncating open fails.
    let (first, _) = a.iter().find(|(_, e)| e.file_type().is_file()).unwrap();
    let f = m.mnt.join(first);
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    assert_eq!(errno_of(w.write_all(b"x")), Some(libc::EROFS));
    drop(w);
    assert_eq!(
        errno_of(
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&f)
        ),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(std::fs::write(&f, b"x")), Some(libc::EROFS));
    assert_eq!(
        errno_of(std::fs::set_permissions(
            &f,
            std::fs::Permissions::from_mode(0o777)
        )),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(std::os::unix::fs::symlink(&f, m.mnt.join("ln"))),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(std::fs::File::create(m.mnt.join("new.txt"))),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(std::fs::create_dir(m.mnt.join("newdir"))),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(std::fs::remove_file(&f)), Some(libc::EROFS));
    assert_eq!(
        errno_of(std::fs::rename(&f, m.mnt.join("moved"))),
        Some(libc::EROFS)
    );
    // statfs gives sensible numbers.
    let st = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    assert_eq!(st.files(), pack_records(&pack));
    assert!(st.blocks() * st.fragment_size() >= std::fs::metadata(&pack).unwrap().len());
    assert_eq!(st.name_max(), 255);
    // Unmount: no mount, no daemon. Another test's child process may hold, between its fork
    // and its exec, a copy of a descriptor this test had open under the mount (seen once under
    // load: EBUSY): a reference that goes within milliseconds, so "busy" is retried briefly; a
    // leaked one would still be there after a second.
    // Busy while a sibling test's child (forked before its exec) still holds a descriptor
    // of the mount: tried again until it lets go, up to 30 s.
    let mut o = loosefs(&[&"umount", &m.mnt]);
    let t = std::time::Instant::now();
    while !o.status.success()
        && String::from_utf8_lossy(&o.stderr).contains("busy")
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(50));
        o = loosefs(&[&"umount", &m.mnt]);
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&m.mnt));
    assert!(
        wait_exit(m.pid, DAEMON_EXIT),
        "daemon {} still running after unmount",
        m.pid
    );
}

fn pack_records(pack: &Path) -> u64 {
    loosefs::pack::reader::Pack::open(pack)
        .unwrap()
        .totals()
        .records
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn every_way_of_unmounting_leaves_nothing_behind() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    type Unmounter<'a> = &'a dyn Fn(&Mounted);
    let methods: [(&str, Unmounter); 5] = [
        ("loosefs umount", &|m| {
            assert!(loosefs(&[&"umount", &m.mnt]).status.success())
        }),
        ("umount", &|m| {
            assert!(
                Command::new("umount")
                    .arg(&m.mnt)
                    .status()
                    .unwrap()
                    .success()
            )
        }),
        ("fusermount3 -u", &|m| {
            assert!(
                Command::new("fusermount3")
                    .arg("-u")
                    .arg(&m.mnt)
                    .status()
                    .unwrap()
                    .success()
            )
        }),
        ("SIGTERM", &|m| {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(m.pid),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap()
        }),
        ("SIGINT", &|m| {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(m.pid),
                nix::sys::signal::Signal::SIGINT,
            )
            .unwrap()
        }),
    ];
    for (name, how) in methods {
        let m = mount(&pack, &tmp.path().join("mnt"), &[]);
        assert!(is_mounted(&m.mnt), "{name}: not mounted");
        assert!(m.mnt.join(".").read_dir().unwrap().count() > 0);
        how(&m);
        assert!(
            wait_exit(m.pid, DAEMON_EXIT),
            "{name}: daemon still running"
        );
        assert!(!is_mounted(&m.mnt), "{name}: mount left behind");
        assert!(
            std::fs::metadata(&m.mnt).is_ok(),
            "{name}: mountpoint unusable"
        );
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn loosefs_umount_of_a_daemon_that_does_not_answer_aborts_its_connection() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    // Over /dev/fuse the abort ends every request, the ones the daemon took too; over io_uring
    // (Linux 6.18) a request already handed to a ring entry ends only when the daemon's rings
    // close, so `loosefs umount` then kills the daemon it found by its command line.
    for transport in ["classic", "uring"] {
        let m = mount(&pack, &tmp.path().join("mnt"), &["--transport", transport]);
        // A reader waits on the stopped daemon (a file never looked up).
        let pid = nix::unistd::Pid::from_raw(m.pid);
        stop(m.pid);
        let waiting = with_timeout(
            {
                let p = m.mnt.join(&names[0]);
                move || std::fs::read(p).map_err(|e| e.raw_os_error())
            },
            Duration::from_secs(120),
        );
        // `loosefs umount` neither hangs on the stats it reads first nor leaves the mount.
        let umount = with_timeout(
            {
                let mnt = m.mnt.clone();
                move || loosefs(&[&"umount", &mnt])
            },
            Duration::from_secs(120),
        )
        .recv()
        .unwrap_or_else(|_| panic!("{transport}: loosefs umount hung on a stopped daemon"));
        let err = String::from_utf8_lossy(&umount.stderr);
        assert!(umount.status.success(), "{transport}: {err}");
        assert!(err.contains("does not answer"), "{transport}: {err}");
        assert!(!is_mounted(&m.mnt), "{transport}: the mount is left");
        let r = waiting
            .recv()
            .unwrap_or_else(|_| panic!("{transport}: the waiting reader was not released"));
        assert!(
            matches!(
                r,
                Err(Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED))
            ),
            "{transport}: {r:?}"
        );
        // Let go (or killed), the daemon finds its connection gone and exits.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        assert!(wait_exit(m.pid, 30), "{transport}: the daemon kept running");
        assert!(
            std::fs::metadata(&m.mnt).is_ok(),
            "{transport}: mountpoint unusable"
        );
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn remounting_right_after_an_unmount_stays_mounted() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let mnt = tmp.path().join("mnt");
    let methods: [&[&str]; 3] = [&LOOSEFS_UMOUNT, &["umount"], &["fusermount3", "-u"]];
    for cmd in methods {
        let name = cmd.join(" ");
        let old = mount(&pack, &mnt, &[]);
        let old_pid = old.pid;
        let o = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg(&mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        // Not dropped: its Drop would detach whatever is mounted at `mnt`, i.e. the new mount.
        std::mem::forget(old);
        let new = mount(&pack, &mnt, &[]);
        assert!(
            wait_exit(old_pid, DAEMON_EXIT),
            "{name}: the old daemon is still running"
        );
        // The old daemon has exited: whatever it unmounted on its way out is gone by now.
        assert!(
            is_mounted(&mnt),
            "{name}: the new mount vanished when the old daemon exited"
        );
        assert!(
            std::fs::read_dir(&mnt).unwrap().count() > 0,
            "{name}: empty"
        );
        drop(new);
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn stale_mount_is_reported_with_the_fix() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let mnt = tmp.path().join("mnt");
    let m = mount(
        &pack,
        &mnt,
        &[
            "--push-ahead",
            "0",
            "--prefetch-max-mb",
            "0",
            "--keeper=false",
        ],
    );
    // Files the kernel already holds (looked up and read: 24 h TTLs, no OPEN, kept pages)
    // keep reading after the daemon dies, with their bytes; anything that needs the daemon
    // fails, and does not hang.
    let names = files(&src);
    assert!(names.len() >= 4);
    let (read, unread) = names.split_at(2);
    for n in read {
        assert_eq!(
            std::fs::read(m.mnt.join(n)).unwrap(),
            std::fs::read(src.join(n)).unwrap()
        );
    }
    // A read in flight when the daemon dies: the daemon is stopped, a read of a file never
    // looked up is started (it waits on the daemon), then the daemon is killed.
    let pid = nix::unistd::Pid::from_raw(m.pid);
    stop(m.pid);
    let in_flight = with_timeout(
        {
            let p = m.mnt.join(&unread[0]);
            move || std::fs::read(p).map_err(|e| e.raw_os_error())
        },
        Duration::from_secs(30),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(wait_exit(m.pid, DAEMON_EXIT));
    let r = in_flight
        .recv()
        .expect("the read in flight hung after the kill");
    // Over io_uring the kernel cancels a request whose ring entry's task died (ECANCELED,
    // `fs/fuse/dev_uring.c`); over /dev/fuse the connection's abort answers it.
    assert!(
        matches!(
            r,
            Err(Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED))
        ),
        "a read in flight at the kill: {:?}",
        r.map(|b| b.len())
    );
    // A file never looked up: ENOTCONN — or, over io_uring, ECANCELED while the dead daemon's
    // ring is still being torn down (the kernel does that after the process has exited, and
    // only then aborts the connection; until then a request queued to one of its ring entries
    // is cancelled, `fs/fuse/dev_uring.c`).
    let gone = |errno: Option<i32>| match errno {
        Some(libc::ENOTCONN | libc::ECONNABORTED) => true,
        Some(libc::ECANCELED) => std::env::var("LOOSEFS_TRANSPORT").as_deref() != Ok("classic"),
        _ => false,
    };
    let r = with_timeout(
        {
            let p = m.mnt.join(&unread[1]);
            move || std::fs::read(p).map_err(|e| e.raw_os_error())
        },
        Duration::from_secs(30),
    )
    .recv()
    .expect("a read after the kill hung");
    assert!(
        matches!(r, Err(e) if gone(e)),
        "a read after the kill: {:?}",
        r.map(|b| b.len())
    );
    // A file read before: the kernel may still hold it (its bytes, never others) or not.
    for n in read {
        match std::fs::read(m.mnt.join(n)) {
            Ok(b) => assert_eq!(b, std::fs::read(src.join(n)).unwrap(), "{n}"),
            Err(e) => assert!(gone(e.raw_os_error()), "{n}: {e}"),
        }
    }
    let e = nix::sys::statvfs::statvfs(&mnt).err();
    assert!(gone(e.map(|e| e as i32)), "{e:?}");
    let o = loosefs(&[&"mount", &pack, &mnt]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a mountpoint that cannot be used: bad usage"
    );
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("stale")
            && msg.contains("Transport endpoint is not connected")
            && msg.contains("loosefs umount"),
        "{msg}"
    );
    let o = loosefs(&[&"umount", &mnt]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&mnt));
    let m2 = mount(&pack, &mnt, &[]);
    assert!(std::fs::read_dir(&m2.mnt).unwrap().count() > 0);
    assert!(loosefs(&[&"umount", &mnt]).status.success());
    assert!(wait_exit(m2.pid, DAEMON_EXIT));
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn bad_mountpoints_and_packs_are_refused() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    // The exit code of each kind (docs/CONFIGURATION.md, "Exit codes"): a mountpoint that
    // cannot be used is bad usage (2), a damaged pack 65, a missing one 66.
    let expect_err = |args: &[&dyn AsRef<std::ffi::OsStr>], want: &str, code: i32| {
        let o = loosefs(args);
        assert_eq!(o.status.code(), Some(code), "should fail: {want}");
        let msg = String::from_utf8_lossy(&o.stderr);
        assert!(msg.contains(want), "expected {want:?} in {msg:?}");
    };
    expect_err(
        &[&"mount", &pack, &tmp.path().join("missing")],
        "does not exist",
        2,
    );
    expect_err(&[&"mount", &pack, &pack], "not a directory", 2);
    let mnt = tmp.path().join("mnt");
    let m = mount(&pack, &mnt, &[]);
    expect_err(&[&"mount", &pack, &mnt], "already a mount point", 2);
    drop(m);
    // Corrupted packs are refused at mount time with the reason, and nothing is mounted.
    let bytes = std::fs::read(&pack).unwrap();
    let bad = tmp.path().join("bad.pack");
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    expect_err(&[&"mount", &bad, &mnt], "truncated", 65);
    let t = loosefs::pack::trailer::Trailer::parse_tail(&bytes).unwrap();
    let mut b = bytes.clone();
    b[t.index_offset as usize + 300] ^= 4;
    std::fs::write(&bad, &b).unwrap();
    expect_err(&[&"mount", &bad, &mnt], "checksum", 65);
    expect_err(
        &[&"mount", &src.join("missing.pack"), &mnt],
        "missing.pack",
        66,
    );
    assert!(!is_mounted(&mnt));
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn damaged_sample_answers_eio_and_is_logged() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let p = loosefs::pack::reader::Pack::open(&pack).unwrap();
    let files = loosefs::verify::file_paths(&p);
    let (victim, i) = files[files.len() / 2].clone();
    let off = p.index().record(i).unwrap().data_off;
    drop(p);
    let mut b = std::fs::read(&pack).unwrap();
    b[off as usize + 5] ^= 0xff;
    std::fs::write(&pack, b).unwrap();
    let m = mount(&pack, &tmp.path().join("mnt"), &[]);
    for _ in 0..2 {
        assert_eq!(
            errno_of(std::fs::read(m.mnt.join(&victim))),
            Some(libc::EIO),
            "{victim}"
        );
    }
    let (other, _) = &files[0];
    assert_eq!(
        std::fs::read(m.mnt.join(other)).unwrap(),
        std::fs::read(src.join(other)).unwrap()
    );
    // In-order passes (push-ahead reaches the victim again and again) log it no more.
    for _ in 0..3 {
        for (f, _) in &files {
            let _ = std::fs::read(m.mnt.join(f));
        }
        loosefs(&[&"drop-cache", &m.mnt]);
    }
    assert!(loosefs(&[&"umount", &m.mnt]).status.success());
    assert!(wait_exit(m.pid, DAEMON_EXIT));
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains(&victim) && log.contains("CRC-32"),
        "log: {log}"
    );
    assert_eq!(log.matches(&victim).count(), 1, "logged once: {log}");
    // Without --log the daemon logs to $XDG_STATE_HOME/loosefs/log/<mountpoint>.log, named
    // when it mounts.
    let state = tmp.path().join("state");
    let mnt2 = tmp.path().join("mnt2");
    std::fs::create_dir_all(&mnt2).unwrap();
    let o = std::process::Command::new(bin())
        .arg("mount")
        .arg(&pack)
        .arg(&mnt2)
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{msg}");
    let name = std::fs::canonicalize(&mnt2).unwrap();
    let name = name.to_string_lossy().trim_matches('/').replace('/', "_");
    let default_log = state.join("loosefs/log").join(format!("{name}.log"));
    assert!(msg.contains(&default_log.display().to_string()), "{msg}");
    // `stats` names it too.
    let st = loosefs(&[&"stats", &mnt2, &"--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["daemon"]["log"], default_log.display().to_string());
    let _ = std::fs::read(mnt2.join(&victim));
    assert!(loosefs(&[&"umount", &mnt2]).status.success());
    let log = std::fs::read_to_string(&default_log).unwrap();
    assert!(
        log.contains(&victim) && log.contains("CRC-32"),
        "log: {log}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&default_log)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // `--log -`: the daemon keeps the stderr `loosefs mount` was given (here a file).
    let err = tmp.path().join("stderr.txt");
    let o = std::process::Command::new(bin())
        .arg("mount")
        .arg(&pack)
        .arg(&mnt2)
        .args(["--log", "-"])
        .stderr(std::fs::File::create(&err).unwrap())
        .status()
        .unwrap();
    assert!(o.success(), "{}", std::fs::read_to_string(&err).unwrap());
    let st = loosefs(&[&"stats", &mnt2, &"--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["daemon"]["log"], "-");
    let _ = std::fs::read(mnt2.join(&victim));
    let pid = st["daemon"]["pid"].as_u64().unwrap() as i32;
    assert!(loosefs(&[&"umount", &mnt2]).status.success());
    assert!(wait_exit(pid, DAEMON_EXIT));
    let log = std::fs::read_to_string(&err).unwrap();
    assert!(log.contains("log on stderr"), "{log}");
    assert!(
        log.contains(&victim) && log.contains("CRC-32"),
        "log: {log}"
    );
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_pack_modified_in_place_answers_eio_one_opened_read_write_unchanged_and_one_replaced_by_rename_keep_serving()
 {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    let (first, last) = (&names[0], &names[names.len() - 1]);
    for (k, what) in ["cp over it", "truncate(2)"].into_iter().enumerate() {
        let live = tmp.path().join(format!("live{k}.pack"));
        std::fs::copy(&pack, &live).unwrap();
        let mnt = tmp.path().join(format!("mnt{k}"));
        let m = mount(&live, &mnt, &["--push-ahead", "0"]);
        let want = std::fs::read(src.join(first)).unwrap();
        assert_eq!(std::fs::read(m.mnt.join(first)).unwrap(), want);
        // Opened read-write and closed unchanged (as some tools do): not a change. Every file
        // is still served whole (all but the last, kept unread for below), and `stats` answers.
        drop(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&live)
                .unwrap(),
        );
        for f in &names[1..names.len() - 1] {
            let got = std::fs::read(m.mnt.join(f));
            assert!(
                got.as_ref().ok() == Some(&std::fs::read(src.join(f)).unwrap()),
                "{what}: {f} after an unchanged read-write open: {:?}",
                got.err()
            );
        }
        assert!(loosefs(&[&"stats", &m.mnt]).status.success(), "{what}");
        if what == "cp over it" {
            let ok = Command::new("cp").arg(&pack).arg(&live).status().unwrap();
            assert!(ok.success(), "{what}");
        } else {
            nix::unistd::truncate(&live, 0).unwrap();
        }
        // The daemon is alive and says EIO for what it can no longer vouch for.
        assert!(alive(m.pid), "{what}: the daemon died");
        assert!(is_mounted(&m.mnt), "{what}: the mount is gone");
        assert_eq!(
            errno_of(std::fs::read(m.mnt.join(last))),
            Some(libc::EIO),
            "{what}: a file not read before"
        );
        // What the kernel still holds is the old, correct content; pages another process's
        // drop_caches took (the Python suite runs beside this one) come back as EIO. Never
        // other bytes.
        match std::fs::read(m.mnt.join(first)) {
            Ok(b) => assert_eq!(b, want, "{what}"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
        }
        let log = std::fs::read_to_string(&m.log).unwrap();
        assert_eq!(
            log.matches("was modified in place").count(),
            1,
            "{what}: {log}"
        );
        assert!(log.contains("was opened for writing"), "{what}: {log}");
        // The daemon still reports.
        assert!(loosefs(&[&"stats", &m.mnt]).status.success(), "{what}");
        assert!(log.contains(&live.display().to_string()), "{log}");
        drop(m);
    }
    // Replacing by rename: the mount keeps the old file and serves it whole.
    let live = tmp.path().join("renamed.pack");
    std::fs::copy(&pack, &live).unwrap();
    let m = mount(&live, &tmp.path().join("mnt-renamed"), &[]);
    let next = tmp.path().join("next.pack");
    std::fs::write(&next, b"not a pack at all").unwrap();
    std::fs::rename(&next, &live).unwrap();
    for f in &names {
        assert!(
            std::fs::read(m.mnt.join(f)).unwrap() == std::fs::read(src.join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn foreground_mount_serves_until_signalled() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (_src, pack) = packed(tmp.path());
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut child = Command::new(bin())
        .arg("mount")
        .arg(&pack)
        .arg(&mnt)
        .arg("--foreground")
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !is_mounted(&mnt) && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(is_mounted(&mnt));
    assert!(std::fs::read_dir(&mnt).unwrap().count() > 0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!is_mounted(&mnt));
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn only_the_owner_reads_unless_allow_other_and_commands_stay_the_owners() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    // Let another user reach the mountpoint's directory.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (src, pack) = packed(tmp.path());
    let name = &files(&src)[0];
    // `cat` as user nobody (65534): its exit code and stderr.
    let cat_as_nobody = |p: &Path| {
        let o = Command::new("cat")
            .arg(p)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (
            o.status.success(),
            o.stdout,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let m = mount(&pack, &tmp.path().join("mnt"), &[]);
    let (ok, _, err) = cat_as_nobody(&m.mnt.join(name));
    assert!(
        !ok && err.contains("Permission denied"),
        "another user read it: {err}"
    );
    assert!(
        std::fs::read(m.mnt.join(name)).is_ok(),
        "the owner reads it"
    );
    drop(m);
    let m = mount(&pack, &tmp.path().join("mnt2"), &["--allow-other"]);
    let (ok, bytes, err) = cat_as_nobody(&m.mnt.join(name));
    assert!(ok, "--allow-other: {err}");
    assert!(bytes == std::fs::read(src.join(name)).unwrap());
    let (ok, _, err) = cat_as_nobody(&m.mnt.join(".loosefs/stats"));
    assert!(ok, "stats is readable by all: {err}");
    for cmd in ["drop-cache", "warm"] {
        let (ok, _, err) = cat_as_nobody(&m.mnt.join(".loosefs").join(cmd));
        assert!(
            !ok && err.contains("Permission denied"),
            "{cmd} ran for another user: {err}"
        );
    }
    assert!(
        loosefs(&[&"drop-cache", &m.mnt]).status.success(),
        "root runs it"
    );
}

/// `/sbin/mount.fuse.loosefs` pointing at this build for the life of the guard: whatever was
/// there (a link to another build, a file) is put back on drop.
struct Helper {
    link: std::path::PathBuf,
    saved: Option<std::path::PathBuf>,
}

impl Helper {
    fn install() -> Helper {
        let link = Path::new("/sbin/mount.fuse.loosefs").to_path_buf();
        let saved = std::fs::symlink_metadata(&link).is_ok().then(|| {
            let aside = link.with_extension(format!("loosefs-test-{}", std::process::id()));
            std::fs::rename(&link, &aside).unwrap();
            aside
        });
        std::os::unix::fs::symlink(bin(), &link).unwrap();
        Helper { link, saved }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        if let Some(p) = &self.saved {
            let _ = std::fs::rename(p, &self.link);
        }
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn mount_8_and_fstab_mount_a_pack_as_fuse_loosefs_with_cli_options() {
    let _timeout = require_mount();
    let _helper = Helper::install();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let o = Command::new("mount")
        .args(["-t", "fuse.loosefs"])
        .arg(&pack)
        .arg(&mnt)
        .args(["-o", "ro,nofail,warm,decode=npy,push_ahead=0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let abs = std::fs::canonicalize(&mnt).unwrap();
    assert_eq!(
        loosefs::mount::mount_fstype(&abs).as_deref(),
        Some("fuse.loosefs")
    );
    let name = &files(&src)[0];
    let npy = mnt.join(name).with_extension("npy");
    assert!(
        std::fs::read(&npy).unwrap().starts_with(b"\x93NUMPY"),
        "decode=npy"
    );
    let stats = loosefs(&[&"stats", &mnt, &"--json"]);
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_ne!(v["warm"]["state"], "idle", "warm: {v}");
    assert_eq!(v["push_ahead"]["samples"], 0);
    // The warm the option started finishes, and finishes well: watched through `stats` only
    // (`warm --wait` would start a warm of its own and hide a failed one).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let v = loop {
        let stats = loosefs(&[&"stats", &mnt, &"--json"]);
        let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
        if v["warm"]["state"] != "running" || std::time::Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(v["warm"]["state"], "done", "warm: {v}");
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    // An fstab line (a private fstab file through `mount -T`).
    let fstab = tmp.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.loosefs ro,allow_other,nofail,x-systemd.automount 0 0\n",
            pack.display(),
            abs.display()
        ),
    )
    .unwrap();
    let o = Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(&abs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(mnt.join(name)).unwrap() == std::fs::read(src.join(name)).unwrap());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(abs.to_str().unwrap()))
        .unwrap();
    assert!(
        line.contains("allow_other") && line.contains("fuse.loosefs"),
        "{line}"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_mountpoint_whose_name_is_not_utf8_is_found_refused_twice_and_unmounted() {
    use std::os::unix::ffi::OsStrExt;
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let mnt = tmp
        .path()
        .join(std::ffi::OsStr::from_bytes(b"mnt-\xff\xfe latin-1 \xe9"));
    let m = mount(&pack, &mnt, &[]);
    assert!(is_mounted(&mnt), "the mount is not found in mountinfo");
    let name = &files(&src)[0];
    assert!(std::fs::read(mnt.join(name)).unwrap() == std::fs::read(src.join(name)).unwrap());
    // A second mount does not stack on the live one.
    let o = loosefs(&[&"mount", &pack, &mnt]);
    assert!(!o.status.success(), "a second mount stacked");
    let o = loosefs(&[&"umount", &mnt]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&mnt));
    assert!(wait_exit(m.pid, DAEMON_EXIT));
}
