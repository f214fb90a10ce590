//! The FUSE-over-io_uring transport (`fuse::uring`): ring entries answered in process by its
//! handler over a real server (no kernel: the bytes the kernel would put in an entry, checked
//! against the kernel's layout), and real mounts over io_uring and over /dev/fuse serving the
//! same bytes, each saying in `stats` which transport carried the requests. The rest of the
//! mount suite runs on both transports (scripts/test.sh runs it again with
//! `LOOSEFS_TRANSPORT=classic`).

mod common;

use common::{
    files, is_mounted, loosefs, mount, packed, require_mount, stop, wait_exit, with_timeout,
};
use loosefs::fs::Fs;
use loosefs::fuse::uring::{Handler, abi};
use loosefs::report::Report;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A ring entry as the kernel fills it: `fuse_in_header` (opcode, unique 7, node), the
/// operation's header at byte 128, the payload length at byte 272 and the payload.
fn entry(opcode: u32, node: u64, op_in: &[u8], payload: &[u8]) -> ([u8; abi::HEADER_LEN], Vec<u8>) {
    let mut h = [0u8; abi::HEADER_LEN];
    h[4..8].copy_from_slice(&opcode.to_le_bytes());
    h[8..16].copy_from_slice(&7u64.to_le_bytes());
    h[16..24].copy_from_slice(&node.to_le_bytes());
    h[32..36].copy_from_slice(&4242u32.to_le_bytes());
    h[128..128 + op_in.len()].copy_from_slice(op_in);
    h[264..272].copy_from_slice(&7u64.to_le_bytes());
    h[272..276].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut p = vec![0u8; 1 << 20];
    p[..payload.len()].copy_from_slice(payload);
    (h, p)
}

/// `fuse_read_in` (also READDIR's) of `size` bytes at `offset`.
fn read_in(offset: u64, size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 40];
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..20].copy_from_slice(&size.to_le_bytes());
    b
}

/// Answers an entry: (the reply's error, its payload).
fn answer(h: &Handler, e: ([u8; abi::HEADER_LEN], Vec<u8>)) -> (i32, Vec<u8>) {
    let (mut header, mut payload) = e;
    let mut input = Vec::new();
    assert_eq!(
        h.serve_entry(&mut header, &mut payload, &mut input),
        7,
        "commit id"
    );
    assert_eq!(
        u64::from_le_bytes(header[8..16].try_into().unwrap()),
        7,
        "unique"
    );
    let len = u32::from_le_bytes(header[272..276].try_into().unwrap()) as usize;
    let error = i32::from_le_bytes(header[4..8].try_into().unwrap());
    assert_eq!(
        u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize,
        16 + len
    );
    (error, payload[..len].to_vec())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn server(pack: &Path) -> Arc<Fs> {
    let opts = common::server_options(0);
    let p = loosefs::pack::reader::Pack::open(pack).unwrap();
    Arc::new(Fs::local(p, Default::default(), opts).unwrap())
}

#[test]
fn ring_entries_are_answered_in_the_kernels_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tree");
    common::make_tree(&src);
    let pack = tmp.path().join("t.pack");
    let o = loosefs(&[&"pack", &src, &pack]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = server(&pack);
    let h = Handler::new(s.clone(), 1000, 100);
    // LOOKUP: fuse_entry_out with the node, its size and the owner given.
    let (err, out) = answer(&h, entry(1, 1, &[], b"class_0\0"));
    assert_eq!((err, out.len()), (0, 128));
    let class = s.lookup(1, b"class_0").unwrap().attr.ino;
    assert_eq!(u64_at(&out, 0), class);
    assert_eq!(
        u32::from_le_bytes(out[40 + 60..40 + 64].try_into().unwrap()) & libc::S_IFMT,
        libc::S_IFDIR
    );
    assert_eq!(
        u32::from_le_bytes(out[40 + 68..40 + 72].try_into().unwrap()),
        1000,
        "uid"
    );
    let (err, out) = answer(&h, entry(1, class, &[], b"img_1.JPEG\0"));
    assert_eq!(err, 0);
    let ino = u64_at(&out, 0);
    let want = std::fs::read(src.join("class_0/img_1.JPEG")).unwrap();
    assert_eq!(u64_at(&out, 48), want.len() as u64, "size");
    // A missing name: a negative entry (node 0) the kernel caches.
    let (err, out) = answer(&h, entry(1, 1, &[], b"nope\0"));
    assert_eq!((err, u64_at(&out, 0)), (0, 0));
    // READ: the file's bytes, then a short read at its end.
    let (err, out) = answer(&h, entry(15, ino, &read_in(0, 128 << 10), &[]));
    assert_eq!((err, out.as_slice()), (0, want.as_slice()));
    let (err, out) = answer(
        &h,
        entry(15, ino, &read_in(want.len() as u64 - 5, 4096), &[]),
    );
    assert_eq!((err, out.as_slice()), (0, &want[want.len() - 5..]));
    // A READ far past the end (found by fuzzing: the read-ahead's ranges overflowed) reads
    // nothing.
    let (err, out) = answer(&h, entry(15, ino, &read_in(u64::MAX - 16, 4096), &[]));
    assert_eq!((err, out.len()), (0, 0));
    // READDIRPLUS of the root: every name, each after its fuse_entry_out.
    let (err, out) = answer(&h, entry(44, 1, &read_in(0, 4096), &[]));
    assert_eq!(err, 0);
    let mut names = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let d = &out[at + 128..];
        let n = u32::from_le_bytes(d[16..20].try_into().unwrap()) as usize;
        names.push(String::from_utf8(d[24..24 + n].to_vec()).unwrap());
        at += 128 + (24 + n).next_multiple_of(8);
    }
    for want in ["class_0", "class_1", "class_2", "empty_class"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // A listing asked for fewer bytes than one entry gets none.
    let (err, out) = answer(&h, entry(44, 1, &read_in(0, 100), &[]));
    assert_eq!((err, out.len()), (0, 0));
    // The fuser adaptor's answers: ENOTTY, zero-message open, EROFS, ENOSYS.
    for (opcode, errno) in [
        (39, libc::ENOTTY),
        (14, libc::ENOSYS),
        (9, libc::EROFS),
        (52, libc::ENOSYS),
    ] {
        assert_eq!(
            answer(&h, entry(opcode, ino, &[], &[])).0,
            -errno,
            "opcode {opcode}"
        );
    }
    // A request that does not parse (a name without its NUL): EIO, the same unique.
    assert_eq!(answer(&h, entry(1, 1, &[], b"class_0")).0, -libc::EIO);
    // WRITE to the announced order: taken whole.
    let dir = s.lookup(1, b".loosefs").unwrap().attr.ino;
    let order = s.lookup(dir, b"order").unwrap().attr.ino;
    let line = b"class_0/img_1.JPEG\n";
    let mut w = read_in(0, line.len() as u32);
    w[16..20].copy_from_slice(&(line.len() as u32).to_le_bytes());
    let (err, out) = answer(&h, entry(16, order, &w, line));
    assert_eq!(
        (err, u32::from_le_bytes(out[..4].try_into().unwrap())),
        (0, line.len() as u32)
    );
    let answered = s
        .stats
        .transport
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(answered, 14, "requests counted");
}

fn report(mnt: &Path) -> Report {
    serde_json::from_slice(&std::fs::read(mnt.join(".loosefs/stats")).unwrap()).unwrap()
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_mount_serves_over_io_uring_where_offered_and_over_dev_fuse_when_asked() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    let offered = Path::new("/sys/module/fuse/parameters/enable_uring").exists();
    if !offered {
        common::missing_prerequisite(
            "this kernel has no FUSE over io_uring (no enable_uring): the uring half did not run",
        );
    }
    let kinds: &[&str] = if offered {
        &["uring", "classic"]
    } else {
        &["classic"]
    };
    for &kind in kinds {
        let m = mount(
            &pack,
            &tmp.path().join(format!("mnt-{kind}")),
            &["--transport", kind],
        );
        for n in &names {
            let got = std::fs::read(m.mnt.join(n)).unwrap();
            assert!(
                got == std::fs::read(src.join(n)).unwrap(),
                "{n} differs over {kind}"
            );
        }
        let listed = std::fs::read_dir(&m.mnt).unwrap().count();
        assert_eq!(listed, std::fs::read_dir(&src).unwrap().count());
        let t = report(&m.mnt).daemon.transport;
        assert_eq!(t.kind, kind);
        // The kernel's own count, not the daemon's: each request the ring hands the daemon
        // is a completion on one of its io_uring descriptors (`CqTail` in their fdinfo).
        let completions = ring_completions(m.pid);
        if kind == "uring" {
            assert!(t.queues >= 1 && t.ring_threads >= t.queues, "{t:?}");
            assert!(t.ring_requests > 0, "{t:?}");
            assert!(
                completions >= names.len() as u64,
                "the kernel completed {completions} ring requests for {} files read",
                names.len()
            );
        } else {
            assert_eq!((t.queues, t.ring_requests), (0, 0), "{t:?}");
            assert_eq!(completions, 0, "requests went through a ring over classic");
        }
    }
    // Passthrough opens need /dev/fuse: asking for both is refused, saying so.
    std::fs::create_dir(tmp.path().join("mnt-pt")).unwrap();
    let o = loosefs(&[
        &"mount",
        &src,
        &tmp.path().join("mnt-pt"),
        &"--passthrough",
        &"on",
        &"--transport",
        &"uring",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("passthrough") && err.contains("--transport classic"),
        "{err}"
    );
}

/// Completions the kernel posted on process `pid`'s io_uring instances: the sum of `CqTail`
/// in the fdinfo of its `anon_inode:[io_uring]` descriptors (0 without any).
fn ring_completions(pid: i32) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let e = e.unwrap();
        let is_ring =
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("[io_uring]"));
        if !is_ring {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("CqTail:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// `loosefs mount PACK MNT --threads 2 --transport KIND` run with `RLIMIT_NOFILE` set to
/// `limit` (soft and hard).
fn mount_with_nofile(pack: &Path, mnt: &Path, kind: &str, limit: u64) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new(common::bin());
    c.arg("mount").arg(pack).arg(mnt).args([
        "--threads",
        "2",
        "--transport",
        kind,
        "--keeper=false",
    ]);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        c.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, limit)
                .map_err(std::io::Error::from)
        });
    }
    c.output().unwrap()
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_ring_that_cannot_have_every_entry_is_not_asked_for_and_uring_refuses_leaving_nothing_mounted()
{
    let _timeout = require_mount();
    if !Path::new("/sys/module/fuse/parameters/enable_uring").exists() {
        return common::missing_prerequisite("this kernel has no FUSE over io_uring");
    }
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // Far too few descriptors: refused before anything is mounted, saying why.
    for kind in ["auto", "uring", "classic"] {
        let o = mount_with_nofile(&pack, &mnt, kind, 24);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{kind}: {err}");
        assert!(err.contains("too few file descriptors"), "{kind}: {err}");
        assert!(!common::is_mounted(&mnt), "{kind} left a mount");
    }
    // Raising the limit two at a time: enough for /dev/fuse but not the ring's every entry
    // comes first. There `auto` serves every file through /dev/fuse (no ring was asked for, so
    // no queue holds requests) and `uring` refuses with nothing mounted.
    let mut fell_back = 0;
    for limit in (60..140).step_by(2) {
        let o = mount_with_nofile(&pack, &mnt, "auto", limit);
        if !o.status.success() {
            assert!(!common::is_mounted(&mnt));
            continue;
        }
        let kind = report(&mnt).daemon.transport.kind;
        if kind == "uring" {
            assert!(loosefs(&[&"umount", &mnt]).status.success());
            break;
        }
        assert_eq!(kind, "classic");
        let log = String::from_utf8_lossy(&o.stderr).into_owned();
        for n in &names {
            assert!(
                std::fs::read(mnt.join(n)).unwrap() == std::fs::read(src.join(n)).unwrap(),
                "{n} differs at RLIMIT_NOFILE {limit}"
            );
        }
        assert!(loosefs(&[&"umount", &mnt]).status.success());
        let o = mount_with_nofile(&pack, &mnt, "uring", limit);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "uring at {limit}: {err} (auto: {log})");
        assert!(
            err.contains("--transport uring") && err.contains("descriptors"),
            "{err}"
        );
        assert!(!common::is_mounted(&mnt), "a refused uring mount stayed");
        fell_back += 1;
    }
    assert!(
        fell_back > 0,
        "no limit between /dev/fuse's and the ring's needs"
    );
}

/// The transports a mount test runs over here: io_uring where the kernel has it, and
/// `/dev/fuse` (under `CI=true` a kernel without io_uring fails the test).
fn transports() -> Vec<&'static str> {
    if Path::new("/sys/module/fuse/parameters/enable_uring").exists() {
        vec!["uring", "classic"]
    } else {
        common::missing_prerequisite("this kernel has no FUSE over io_uring: classic only");
        vec!["classic"]
    }
}

/// Requests the kernel has sent to the daemon of the mount at `mnt` and not seen answered
/// (`/sys/fs/fuse/connections/N/waiting`, N the mount's device minor; fusectl is mounted
/// there if it is not yet).
fn waiting(mnt: &Path) -> u64 {
    let abs = std::fs::canonicalize(mnt.parent().unwrap())
        .unwrap()
        .join(mnt.file_name().unwrap());
    let dir = loosefs::mount::connection_dir(&abs)
        .unwrap_or_else(|| panic!("{} is not in mountinfo", abs.display()));
    std::fs::read_to_string(dir.join("waiting"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Names of the threads and targets of the open descriptors of process `pid`, sorted.
fn threads_and_fds(pid: i32) -> (Vec<String>, Vec<String>) {
    let list = |d: String, f: &dyn Fn(std::path::PathBuf) -> String| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .map(|d| d.flatten().map(|e| f(e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    (
        list(format!("/proc/{pid}/task"), &|p| {
            std::fs::read_to_string(p.join("comm")).unwrap_or_default()
        }),
        list(format!("/proc/{pid}/fd"), &|p| {
            std::fs::read_link(p).map_or(String::new(), |l| l.display().to_string())
        }),
    )
}

fn signal(pid: i32, s: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s).unwrap();
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn sigterm_with_requests_in_flight_ends_every_reader_and_leaves_no_mount() {
    use nix::sys::signal::Signal::{SIGCONT, SIGTERM};
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    for transport in transports() {
        let m = mount(&pack, &tmp.path().join("mnt"), &["--transport", transport]);
        stop(m.pid);
        // Four readers of files never looked up: requests the daemon holds.
        let readers: Vec<_> = (names[..4].iter())
            .map(|n| {
                let (p, want) = (m.mnt.join(n), std::fs::read(src.join(n)).unwrap());
                with_timeout(
                    move || {
                        std::fs::read(p)
                            .map(|b| b == want)
                            .map_err(|e| e.raw_os_error())
                    },
                    Duration::from_secs(120),
                )
            })
            .collect();
        // At least one request held (lookups of one directory may wait for one another in
        // the kernel rather than reach the daemon together).
        common::wait_until(&format!("{transport}: a request in flight"), 60, || {
            waiting(&m.mnt) >= 1
        });
        signal(m.pid, SIGTERM);
        signal(m.pid, SIGCONT);
        for r in readers {
            let r = r
                .recv()
                .unwrap_or_else(|_| panic!("{transport}: a reader hung after SIGTERM"));
            // Answered in full before the daemon went, told the connection is gone, or (a
            // lookup after the mount was detached) that the mountpoint holds no such file:
            // never wrong bytes, never a wait.
            assert!(
                matches!(
                    r,
                    Ok(true)
                        | Err(Some(
                            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENOENT
                        ))
                ),
                "{transport}: {r:?}"
            );
        }
        assert!(wait_exit(m.pid, 30), "{transport}: the daemon kept running");
        assert!(!is_mounted(&m.mnt), "{transport}: the mount is left");
        // The mountpoint takes a new mount that serves every file.
        let m = mount(&pack, &tmp.path().join("mnt"), &["--transport", transport]);
        for n in &names {
            assert!(
                std::fs::read(m.mnt.join(n)).unwrap() == std::fs::read(src.join(n)).unwrap(),
                "{transport}: {n}"
            );
        }
        assert!(loosefs(&[&"umount", &m.mnt]).status.success());
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_reader_killed_mid_read_leaves_the_mount_serving_and_nothing_leaked() {
    use nix::sys::signal::Signal::{SIGCONT, SIGKILL};
    use std::io::{BufRead, Write};
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    for transport in transports() {
        // No push-ahead: a file pushed into the page cache after the first read would be read
        // without a READ reaching the daemon.
        let m = mount(
            &pack,
            &tmp.path().join("mnt"),
            &["--transport", transport, "--push-ahead", "0"],
        );
        assert!(
            std::fs::read(m.mnt.join(&names[0])).unwrap()
                == std::fs::read(src.join(&names[0])).unwrap()
        );
        // The daemon settles after its first reads (fuser names its threads once they run,
        // the log is opened after "ready"): two looks 100 ms apart agree.
        let mut before = threads_and_fds(m.pid);
        common::wait_until("the daemon settled", 60, || {
            std::thread::sleep(Duration::from_millis(100));
            let now = threads_and_fds(m.pid);
            std::mem::replace(&mut before, now) == before
        });
        let mut killed = 0;
        for round in 0..3 {
            // Files far from the one read and from each other (no read-ahead reaches them).
            let n = &names[(round + 1) * names.len() / 4];
            // The reader opens its file, then reads it once told to: its READ is what the
            // stopped daemon holds when the reader is killed.
            let mut reader = std::process::Command::new("sh")
                .args([
                    "-c",
                    "exec 3<\"$1\" && echo opened && read go && cat <&3 >/dev/null",
                    "sh",
                ])
                .arg(m.mnt.join(n))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufReader::new(reader.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line, "opened\n", "{transport}");
            stop(m.pid);
            let at = waiting(&m.mnt);
            writeln!(reader.stdin.as_mut().unwrap()).unwrap();
            // Its READ reaches the stopped daemon, or (rarely, seen over /dev/fuse in CI) the
            // kernel answers it without one and the reader ends by itself: that round then
            // kills nothing, and is counted.
            let mut ended = None;
            common::wait_until(
                &format!("{transport}: the reader's READ in flight"),
                60,
                || {
                    ended = reader.try_wait().unwrap();
                    ended.is_some() || waiting(&m.mnt) > at
                },
            );
            if ended.is_none() {
                reader.kill().unwrap();
                assert_eq!(
                    reader.wait().unwrap().signal(),
                    Some(SIGKILL as i32),
                    "{transport}: the reader was not killed in its READ"
                );
                killed += 1;
            }
            signal(m.pid, SIGCONT);
        }
        eprintln!("{transport}: {killed} of 3 readers killed in their READ");
        // A round may end without a kill (the kernel answered the READ itself), never all
        // three: else the test would pass without testing a kill mid-READ.
        assert!(killed >= 1, "{transport}: no reader was killed in its READ");
        // Every file reads right through the same mount, and the daemon's threads and
        // descriptors are what they were (a ring entry whose request died is registered again).
        for n in &names {
            assert!(
                std::fs::read(m.mnt.join(n)).unwrap() == std::fs::read(src.join(n)).unwrap(),
                "{transport}: {n}"
            );
        }
        let t = std::time::Instant::now();
        while threads_and_fds(m.pid) != before {
            assert!(
                t.elapsed().as_secs() < 60,
                "{transport}: threads and descriptors {:?}, {before:?} before",
                threads_and_fds(m.pid)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(loosefs(&[&"umount", &m.mnt]).status.success());
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn one_mib_reads_o_direct_and_any_thread_count_serve_the_same_bytes() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big");
    std::fs::create_dir(&src).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let sizes = [(4 << 20) + 1, 1 << 20, (3 << 20) - 7, 5000];
    for (k, size) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..*size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(src.join(format!("{k}.bin")), bytes).unwrap();
    }
    let pack = tmp.path().join("big.pack");
    let o = loosefs(&[&"pack", &src, &pack]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for transport in transports() {
        for threads in ["1", "64"] {
            let m = mount(
                &pack,
                &tmp.path().join(format!("mnt-{transport}-{threads}")),
                &["--transport", transport, "--threads", threads],
            );
            let what = format!("{transport} --threads {threads}");
            let reads0 = report(&m.mnt).requests["read"];
            // O_DIRECT in 1 MiB reads into a page-aligned buffer: each is one READ of 1 MiB.
            let mut direct_reads = 0;
            for k in 0..sizes.len() {
                let want = std::fs::read(src.join(format!("{k}.bin"))).unwrap();
                assert!(
                    o_direct(&m.mnt.join(format!("{k}.bin"))) == want,
                    "{what}: {k}.bin"
                );
                direct_reads += want.len().div_ceil(1 << 20).max(1);
            }
            let reads = report(&m.mnt).requests["read"] - reads0;
            assert!(
                reads <= direct_reads as u64 + sizes.len() as u64,
                "{what}: {reads} READs for {direct_reads} reads of 1 MiB"
            );
            // Eight readers at once, buffered.
            let handles: Vec<_> = (0..8)
                .map(|r| {
                    let (mnt, src) = (m.mnt.clone(), src.clone());
                    std::thread::spawn(move || {
                        for k in (0..sizes.len()).cycle().skip(r).take(sizes.len()) {
                            let n = format!("{k}.bin");
                            assert!(
                                std::fs::read(mnt.join(&n)).unwrap()
                                    == std::fs::read(src.join(&n)).unwrap()
                            );
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .unwrap_or_else(|_| panic!("{what}: a reader failed"));
            }
            assert!(loosefs(&[&"umount", &m.mnt]).status.success());
        }
    }
}

/// The file at `p` read with O_DIRECT in 1 MiB reads into a page-aligned buffer.
fn o_direct(p: &Path) -> Vec<u8> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: the layout is non-zero in size; the buffer is freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: `ptr` is valid for 1 MiB of initialised bytes until it is freed below.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 1 << 20) };
    let mut out = Vec::new();
    loop {
        let n = f.read_at(buf, out.len() as u64).unwrap();
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
    }
    // SAFETY: allocated above with this layout, and `buf` is not used after this.
    unsafe { std::alloc::dealloc(ptr, layout) };
    out
}
