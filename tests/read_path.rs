//! The read path through real mounts (root and /dev/fuse; `#[ignore]`d otherwise): the hidden
//! control directory, statistics, read-ahead in pack order, drop-cache, warm and pinning, with
//! bytes always identical to the source.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The read-path tests run one at a time: one of them empties every cache of the machine
/// (`drop_caches`), and the others assert exact cache hits, misses and request counts.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn stats(mnt: &Path) -> Value {
    let o = loosefs(&[&"stats", &mnt, &"--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn n(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} in {v}"))
}

fn read_all_and_compare(src: &Path, mnt: &Path, names: &[String]) -> u64 {
    let mut bytes = 0;
    for f in names {
        let got = std::fs::read(mnt.join(f)).unwrap();
        assert!(
            got == std::fs::read(src.join(f)).unwrap(),
            "{f}: bytes differ"
        );
        bytes += got.len() as u64;
    }
    bytes
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn control_directory_is_hidden_but_reachable_and_stats_count_reads() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    // Push-ahead off: this test checks exact READ and byte accounting.
    let m = mount(&pack, &tmp.path().join("mnt"), &["--push-ahead", "0"]);
    let root: Vec<String> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !root.iter().any(|n| n == ".loosefs"),
        "the control directory must not be listed"
    );
    assert!(m.mnt.join(".loosefs").is_dir());
    let listed: Vec<String> = std::fs::read_dir(m.mnt.join(".loosefs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed,
        ["stats", "metrics", "order"],
        "only the reports and the order are listed; commands are reachable by name"
    );
    assert_eq!(
        std::fs::metadata(m.mnt.join(".loosefs/no-such"))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );
    let before = stats(&m.mnt);
    let names = files(&src);
    let (last, first) = names.split_last().unwrap();
    let bytes = read_all_and_compare(&src, &m.mnt, first);
    let after = stats(&m.mnt);
    assert!(n(&after, &["requests", "read"]) >= first.len() as u64);
    assert!(n(&after, &["requests", "lookup"]) >= first.len() as u64);
    assert_eq!(
        n(&after, &["bytes_served"]) - n(&before, &["bytes_served"]),
        bytes,
        "each byte served once (then page cache)"
    );
    assert!(n(&after, &["latency_us", "read", "count"]) >= first.len() as u64);
    assert!(after["latency_us"]["read"]["p99_us"].as_f64().unwrap() > 0.0);
    // The stats file is made afresh at every open, although file pages are cached across
    // opens on this mount: a sample read between two reads of it shows in the second.
    let last_bytes = read_all_and_compare(&src, &m.mnt, std::slice::from_ref(last));
    let again = stats(&m.mnt);
    assert_eq!(
        n(&again, &["bytes_served"]) - n(&after, &["bytes_served"]),
        last_bytes,
        "the second stats read shows the sample read since the first"
    );
    assert!(n(&again, &["requests", "read"]) > n(&after, &["requests", "read"]));
    assert_eq!(n(&after, &["pack", "samples"]), names.len() as u64);
    assert_eq!(n(&after, &["daemon", "pid"]), m.pid as u64);
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn in_order_reads_prefetch_ahead_and_drop_cache_makes_reads_cold() {
    let _timeout = require_mount();
    let _serial = serial();
    shared_sample().expect("this test needs ../shared/data/imagenet-sample (at least 16 files)");
    let tmp = disk_tempdir();
    // Page-aligned samples: every page of a served sample can be released (with the default
    // 512-byte alignment neighbours share a page, which stays).
    let (src, pack) = packed_with(tmp.path(), &["--align", "4096"]);
    // Push-ahead off: this test counts READ requests and pack-cache misses of read-ahead alone.
    let m = mount(&pack, &tmp.path().join("mnt"), &["--push-ahead", "0"]);
    let names = files(&src);
    // Cold start: evict the pack's pages.
    let d = loosefs(&[&"drop-cache", &m.mnt, &"--json"]);
    assert!(d.status.success());
    let dv: Value = serde_json::from_slice(&d.stdout).unwrap();
    let pack_len = std::fs::metadata(&pack).unwrap().len();
    assert!(
        n(&dv, &["pack_resident_bytes_after"]) < pack_len / 20,
        "drop-cache left the pack resident: {dv}"
    );
    // Read-ahead, checked against the kernel (mincore of the pack), not the daemon's counters:
    // after 12 files read in pack order, the next files' bytes come into the page cache before
    // anyone reads them (90% of their pages: this machine's DAMON pageout may take a few back,
    // see the warm test).
    assert!(names.len() >= 16, "the fixture has {} files", names.len());
    let ranges = pack_ranges(&pack, &names);
    read_all_and_compare(&src, &m.mnt, &names[..12]);
    wait_until("read-ahead of files 12..14", 10, || {
        ranges[12..14]
            .iter()
            .all(|r| resident_in(&pack, r.clone()) >= pages_of(r.clone()) / 10 * 9)
    });
    read_all_and_compare(&src, &m.mnt, &names[12..]);
    let s = stats(&m.mnt);
    // No double caching: each sample's pack pages were dropped once it was served in full (the
    // mount's page cache holds the bytes now).
    assert!(
        n(&s, &["page_cache", "samples_evicted_after_serving"]) >= names.len() as u64,
        "{s}"
    );
    assert!(
        n(&s, &["pack", "resident_bytes"]) < pack_len / 4,
        "pack still cached after serving: {s}"
    );
    // Every page of a served sample goes, its last one too (the rest of it is the padding up
    // to the next aligned sample): a tenth of the samples may race the kernel.
    let kept = ranges
        .iter()
        .filter(|r| resident_in(&pack, (*r).clone()) > 0)
        .count();
    assert!(
        kept <= names.len() / 10,
        "{kept} of {} served samples keep pages in the pack's page cache",
        names.len()
    );
    // drop-cache empties the kernel's copies of the files too, so the next pass goes back to
    // the daemon and to disk.
    let reads_before = n(&s, &["requests", "read"]);
    let d = loosefs(&[&"drop-cache", &m.mnt, &"--json"]);
    let dv: Value = serde_json::from_slice(&d.stdout).unwrap();
    assert!(n(&dv, &["inodes_invalidated"]) >= names.len() as u64);
    assert!(
        n(&dv, &["pack_resident_bytes_after"]) < pack_len / 20,
        "{dv}"
    );
    read_all_and_compare(&src, &m.mnt, &names);
    let s2 = stats(&m.mnt);
    assert!(
        n(&s2, &["requests", "read"]) >= reads_before + names.len() as u64,
        "files were served again after drop-cache"
    );
    assert!(n(&s2, &["page_cache", "misses"]) > n(&s, &["page_cache", "misses"]));
    drop(m);
    // With --keep-pack-cache the pack's pages stay after serving (both caches hold the bytes).
    let m = mount(&pack, &tmp.path().join("mnt2"), &["--keep-pack-cache"]);
    loosefs(&[&"drop-cache", &m.mnt]);
    read_all_and_compare(&src, &m.mnt, &names);
    let s3 = stats(&m.mnt);
    assert_eq!(n(&s3, &["page_cache", "samples_evicted_after_serving"]), 0);
    assert!(n(&s3, &["pack", "resident_bytes"]) > pack_len / 2, "{s3}");
    drop(m);
    // Read-ahead off: the same 12 files bring in nothing else. No background reader exists
    // then, so the state is final when the reads return: the next files are not resident and
    // the daemon read from the device no more than the 12 files (and the index).
    let m = mount(
        &pack,
        &tmp.path().join("mnt3"),
        &["--prefetch-max-mb", "0", "--push-ahead", "0"],
    );
    loosefs(&[&"drop-cache", &m.mnt]);
    let io0 = block_read_bytes(m.pid);
    read_all_and_compare(&src, &m.mnt, &names[..12]);
    let io = block_read_bytes(m.pid) - io0;
    for r in &ranges[12..14] {
        assert_eq!(
            resident_in(&pack, r.clone()),
            0,
            "read ahead with read-ahead off"
        );
    }
    let files: u64 = ranges[..12].iter().map(|r| pages_of(r.clone())).sum();
    let index = index_bytes(&pack);
    assert!(
        io <= files + index + (1 << 20),
        "read {io} bytes for {files} of files"
    );
}

/// Byte range in the pack of each of `names` (relative paths), in that order.
fn pack_ranges(pack: &Path, names: &[String]) -> Vec<std::ops::Range<u64>> {
    let p = loosefs::pack::reader::Pack::open(pack).unwrap();
    let ix = p.index();
    let by_name: std::collections::HashMap<String, u32> =
        loosefs::verify::file_paths(&p).into_iter().collect();
    names
        .iter()
        .map(|n| {
            let r = ix.record(by_name[n]).unwrap();
            r.data_off..r.data_off + r.size
        })
        .collect()
}

/// Bytes of the whole pages covering `r`.
fn pages_of(r: std::ops::Range<u64>) -> u64 {
    (r.end.div_ceil(4096) - r.start / 4096) * 4096
}

/// Bytes of the pages of `r` of file `p` in the page cache (mincore; mapping reads nothing).
fn resident_in(p: &Path, r: std::ops::Range<u64>) -> u64 {
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: a read-only map of a file nobody writes; only mincore looks at it.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let start = (r.start / 4096 * 4096) as usize;
    let len = (r.end as usize).min(map.len()) - start;
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range lies inside the live mapping and `v` has one byte per page of it.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(start) as *mut libc::c_void,
            len,
            v.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    v.iter().filter(|b| *b & 1 != 0).count() as u64 * 4096
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn warm_streams_the_whole_pack_into_the_page_cache() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    // Push-ahead off: this test counts READ requests and pack-cache misses of read-ahead alone.
    let m = mount(&pack, &tmp.path().join("mnt"), &["--push-ahead", "0"]);
    let pack_len = std::fs::metadata(&pack).unwrap().len();
    let data_end = loosefs::pack::reader::Pack::open(&pack)
        .unwrap()
        .totals()
        .data_end;
    loosefs(&[&"drop-cache", &m.mnt]);
    // Independent oracle: the pack's pages as the kernel sees them (mincore).
    let before = resident_bytes(&pack);
    assert!(
        before < pack_len / 20,
        "{before} of {pack_len} bytes resident after drop-cache"
    );
    // This kind of machine runs a host-configured DAMON pageout scheme (kdamond.0, `paddr`,
    // action pageout on physical regions idle for 12 aggregation intervals): a page cached in
    // such a region can be paged out within a second of being read, by nothing loosefs does
    // (traced with the `filemap:mm_filemap_delete_from_page_cache` event: up to 1,800 pages of
    // this pack within 0.5 s of a warm, all by kdamond.0). Residency is therefore checked
    // against 90% of the sample data and the pass after the warm may read 10% of it again;
    // a warm that read nothing fails both by ten times the margin.
    let io_warm0 = block_read_bytes(m.pid);
    let o = loosefs(&[&"warm", &m.mnt, &"--wait"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let io_warm = block_read_bytes(m.pid) - io_warm0;
    let s = stats(&m.mnt);
    assert_eq!(s["warm"]["state"], "done");
    assert_eq!(n(&s, &["warm", "bytes_done"]), data_end);
    // The warm read the sample data from the device (the kernel's count of the daemon's block
    // reads, not the daemon's own bookkeeping).
    assert!(
        io_warm + before >= data_end / 4096 * 4096,
        "the warm read {io_warm} bytes from the device for {data_end} bytes of sample data"
    );
    let after = resident_bytes(&pack);
    assert!(
        after >= data_end / 10 * 9,
        "{after} of {data_end} bytes resident after warm"
    );
    // The pass after the warm reads (almost) nothing of the sample data from the device: the
    // daemon's own block reads (/proc/PID/io) stay within the index and central directory,
    // which the warm does not cover and the lookups of the pass fault in, plus what the
    // pageout above took back.
    let io0 = block_read_bytes(m.pid);
    read_all_and_compare(&src, &m.mnt, &files(&src));
    let io = block_read_bytes(m.pid) - io0;
    let s = stats(&m.mnt);
    assert!(
        io <= pack_len - data_end + (1 << 20) + data_end / 10,
        "after warm the pass read {io} bytes from the device: {s}"
    );
    drop(m);
    // --warm at mount time does the same by itself.
    let m = mount(&pack, &tmp.path().join("mnt2"), &["--warm"]);
    wait_until("warm at mount", 60, || {
        stats(&m.mnt)["warm"]["state"] == "done"
    });
}

/// Whether every page of file `p` is in the page cache (mincore of a shared mapping; mapping
/// reads nothing).
fn in_page_cache(p: &Path) -> bool {
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return true;
    }
    // SAFETY: a read-only map of a file nobody writes; only mincore looks at it.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range is the live mapping and `v` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore {}", p.display());
    v.iter().all(|b| b & 1 != 0)
}

/// Bytes of file `p` in the page cache (mincore of a shared mapping; mapping reads nothing).
fn resident_bytes(p: &Path) -> u64 {
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a read-only map of a file nobody writes; only mincore looks at it.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range is the live mapping and `v` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore {}", p.display());
    v.iter().filter(|b| *b & 1 != 0).count() as u64 * 4096
}

/// Bytes process `pid` has caused to be read from block devices (`read_bytes` of
/// /proc/PID/io).
fn block_read_bytes(pid: i32) -> u64 {
    io_read_bytes(&format!("/proc/{pid}/io"))
}

/// `read_bytes` of an `io` file of /proc (a process's, or `/proc/thread-self/io`).
fn io_read_bytes(io: &str) -> u64 {
    std::fs::read_to_string(io)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: ")?.trim().parse().ok())
        .unwrap()
}

/// Reads the executable and shared libraries process `pid` maps back into the page cache
/// (by this process, so its own `read_bytes` is untouched): after `drop_caches` the daemon's
/// page faults on its own code would count in its `read_bytes` as if they were pack reads.
/// The pack, mapped or not, is neither.
fn page_in_code(pid: i32) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let code: std::collections::BTreeSet<PathBuf> = (maps.lines())
        .filter_map(|l| l.split_whitespace().nth(5).map(PathBuf::from))
        .filter(|p| *p == exe || p.to_string_lossy().contains(".so"))
        .collect();
    for path in code {
        let _ = std::fs::read(path);
    }
}

fn drop_all_caches() {
    std::process::Command::new("sync").status().unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches (root)");
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn pinned_pack_survives_drop_caches_and_oversize_pins_are_refused() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    let pack_len = std::fs::metadata(&pack).unwrap().len();
    // `--wait` returns only once the whole pack is pinned.
    let m = mount(&pack, &tmp.path().join("mnt"), &["--pin", "all", "--wait"]);
    let s = stats(&m.mnt);
    assert_eq!(
        (
            n(&s, &["pin", "pinned_bytes"]),
            n(&s, &["pin", "target_bytes"])
        ),
        (pack_len, pack_len),
        "mount --pin all --wait returned before the pin was complete: {s}"
    );
    let vmlck: u64 = std::fs::read_to_string(format!("/proc/{}/status", m.pid))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmLck:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    assert!(
        vmlck * 1024 >= pack_len,
        "VmLck {vmlck} kB < pack {pack_len} B"
    );
    drop_all_caches();
    let d = loosefs(&[&"drop-cache", &m.mnt, &"--json"]);
    let dv: Value = serde_json::from_slice(&d.stdout).unwrap();
    assert!(
        n(&dv, &["pack_resident_bytes_after"]) >= pack_len / 4096 * 4096,
        "pinned pages evicted: {dv}"
    );
    read_all_and_compare(&src, &m.mnt, &files(&src));
    let s = stats(&m.mnt);
    assert_eq!(
        n(&s, &["page_cache", "misses"]),
        0,
        "a pinned pack serves from memory: {s}"
    );
    drop(m);
    // A pin that cannot fit is refused before mounting, naming the limit: run the mount in a
    // memory cgroup limited to 64 MiB (v1 or v2, whichever this machine has).
    let cg = MemCgroup::new(64 << 20).expect(
        "cannot create a memory cgroup (v1 or v2) as root: the pin refusal cannot be tested",
    );
    let mnt = tmp.path().join("mnt3");
    std::fs::create_dir_all(&mnt).unwrap();
    let script = format!(
        "echo $$ > {}; exec {} mount {} {} --pin all",
        cg.procs.display(),
        bin(),
        pack.display(),
        mnt.display()
    );
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("cannot pin") && msg.contains("cgroup limit"),
        "{msg}"
    );
    assert!(!is_mounted(&mnt));
}

/// A temporary memory cgroup with a limit; removed on drop.
struct MemCgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl MemCgroup {
    fn new(limit: u64) -> Option<MemCgroup> {
        let name = format!("loosefs-test-{}", std::process::id());
        for (root, limit_file) in [
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
            ("/sys/fs/cgroup", "memory.max"),
            ("/sys/fs/cgroup/unified", "memory.max"),
        ] {
            let dir = Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if std::fs::write(dir.join(limit_file), limit.to_string()).is_ok() {
                return Some(MemCgroup {
                    procs: dir.join("cgroup.procs"),
                    dir,
                });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn push_ahead_serves_the_next_samples_without_a_round_trip() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    let m = mount(&pack, &tmp.path().join("mnt"), &[]);
    let names = files(&src);
    assert!(
        names.len() >= 12,
        "the fixture has {} files; this test needs 12 in pack order",
        names.len()
    );
    // Push-ahead pushes only samples whose pack pages are cached (it never reads the disk
    // itself) and only as far as the stream reads ahead, which after n files in order is about
    // n files: bring the pack into the page cache, then read 4 files in order.
    std::fs::read(&pack).unwrap();
    // List first (as loaders do), so the kernel knows the inodes it will be pushed data for.
    let _ = files(&m.mnt);
    read_all_and_compare(&src, &m.mnt, &names[..4]);
    wait_until("push-ahead", 20, || {
        n(&stats(&m.mnt), &["push_ahead", "samples"]) >= 3
    });
    // The files pushed are in the mount's page cache (mincore), in pack order after the last
    // one read; reading them sends no READ.
    let pushed: Vec<String> = names[4..]
        .iter()
        .take_while(|name| in_page_cache(&m.mnt.join(name)))
        .cloned()
        .collect();
    assert!(pushed.len() >= 2, "files pushed after the 4th: {pushed:?}");
    let before = stats(&m.mnt);
    read_all_and_compare(&src, &m.mnt, &pushed);
    let after = stats(&m.mnt);
    assert_eq!(
        n(&after, &["requests", "read"]),
        n(&before, &["requests", "read"]),
        "pushed samples are read with no READ request"
    );
    // Disabled: every file is a READ.
    let m2 = mount(&pack, &tmp.path().join("mnt2"), &["--push-ahead", "0"]);
    let _ = files(&m2.mnt);
    read_all_and_compare(&src, &m2.mnt, &names[..8]);
    // Nothing to wait for: with --push-ahead 0 no push thread is started at all.
    let s = stats(&m2.mnt);
    assert_eq!(n(&s, &["push_ahead", "samples"]), 0);
    assert!(n(&s, &["requests", "read"]) >= 8);
}

/// A cold pass over `names` through mount `m`, after every cache of the machine was emptied:
/// each file read whole, in `names`' order, by opening its path (with `list` the tree is
/// listed first, as ImageFolder does; without, the reader opens paths it never listed, as a
/// file list or the C bench reader does). Returns the bytes served and the bytes the daemon
/// read from the block device meanwhile (`read_bytes` of /proc/PID/io, which counts the
/// read-ahead the daemon asks for too).
fn cold_pass(m: &Mounted, src: &Path, names: &[String], list: bool) -> ColdPass {
    drop_all_caches();
    page_in_code(m.pid);
    let vm0 = vmstat();
    let io0 = block_read_bytes(m.pid);
    if list {
        let listed = walkdir::WalkDir::new(&m.mnt)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.file_name() != ".loosefs")
            .count();
        assert!(listed > names.len());
    }
    let served = read_all_and_compare(src, &m.mnt, names);
    let read = block_read_bytes(m.pid) - io0;
    let vm = vmstat();
    let host = ["pgsteal_kdamond", "workingset_refault_file", "pgmajfault"]
        .iter()
        .map(|k| {
            format!(
                "{k} +{}",
                vm.get(*k).unwrap_or(&0) - vm0.get(*k).unwrap_or(&0)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    ColdPass { served, read, host }
}

/// Bytes read from the device to open every file of `names` under `src` after the page cache
/// is dropped: the directory blocks and inodes a daemon serving them looks up too. Counted for
/// this thread alone (`/proc/thread-self/io`), so other tests' reads do not count.
fn lookup_cost(src: &Path, names: &[String]) -> u64 {
    let thread_read = || io_read_bytes("/proc/thread-self/io");
    drop_all_caches();
    let before = thread_read();
    for n in names {
        drop(std::fs::File::open(src.join(n)).unwrap());
    }
    let cost = thread_read() - before;
    eprintln!("opening {} files cold read {cost} bytes", names.len());
    cost
}

/// What one cold pass served and read, and what the host's memory management did meanwhile.
struct ColdPass {
    served: u64,
    read: u64,
    /// /proc/vmstat deltas (DAMON's page-outs, refaults): they tell a host that took pages
    /// back mid-pass from a daemon that reads twice.
    host: String,
}

/// /proc/vmstat's counters.
fn vmstat() -> std::collections::HashMap<String, u64> {
    (std::fs::read_to_string("/proc/vmstat").unwrap().lines())
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The least a cold pass over the test data may serve: below this, 10 % of read-ahead or of
/// a double read hides inside the slack (the corpus and ../shared/data's sample hold ~100 MB).
const COLD_PASS_MIN: u64 = 50_000_000;

/// Asserts the daemon read each stored byte once: at least 0.9x the bytes served (a count
/// that saw nothing, a source on tmpfs, or caches not dropped cannot pass), at most 1.1x
/// plus the index (which `drop_caches` evicted too) and one read-ahead window past the last
/// file.
fn assert_read_once(what: &str, pass: &ColdPass, slack: u64) {
    let (served, read) = (pass.served, pass.read);
    eprintln!(
        "{what}: read {read} bytes for {served} served ({:.3}x; slack {slack})",
        read as f64 / served as f64
    );
    assert!(
        served >= COLD_PASS_MIN,
        "{what}: only {served} bytes served; the test data must hold at least {COLD_PASS_MIN}"
    );
    assert!(
        read <= served + served / 10 + slack,
        "{what}: the daemon read {read} bytes from the device for {served} bytes served \
         ({:.2}x; at most 1.1x, plus {slack} bytes of index and read-ahead; host meanwhile: {})",
        read as f64 / served as f64,
        pass.host
    );
    assert!(
        read >= served - served / 10,
        "{what}: the daemon read only {read} bytes from the device for {served} bytes served \
         ({:.2}x; at least 0.9x: was the page cache dropped, is the source on a block device?)",
        read as f64 / served as f64
    );
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_cold_pass_in_pack_order_reads_each_stored_byte_once_with_default_options() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    let names = files(&src);
    let index = index_bytes(&pack);
    for list in [false, true] {
        let m = mount(&pack, &tmp.path().join(format!("mnt-{list}")), &[]);
        let pass = cold_pass(&m, &src, &names, list);
        assert_read_once(
            &format!("pack order, tree listed first: {list}"),
            &pass,
            index + (1 << 20),
        );
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_cold_pass_along_an_announced_order_reads_each_stored_byte_once() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let (src, pack) = packed(tmp.path());
    let mut names = files(&src);
    shuffle(&mut names, 99);
    let index = index_bytes(&pack);
    for list in [false, true] {
        let m = mount(&pack, &tmp.path().join(format!("mnt-{list}")), &[]);
        let text: String = names.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(m.mnt.join(".loosefs/order"), &text).unwrap();
        let pass = cold_pass(&m, &src, &names, list);
        assert_read_once(
            &format!("announced order, tree listed first: {list}"),
            &pass,
            index + (1 << 20),
        );
        let s = stats(&m.mnt);
        assert_eq!(n(&s, &["order", "served"]), names.len() as u64, "{s}");
    }
}

#[test]
#[ignore = "mounts: needs root and /dev/fuse"]
fn a_cold_pass_over_a_directory_mount_reads_each_file_once() {
    let _timeout = require_mount();
    let _serial = serial();
    let tmp = disk_tempdir();
    let src = tmp.path().join("tree");
    // A copy on this test's own disk: the shared sample may sit elsewhere.
    let orig = dataset(tmp.path());
    for name in files(&orig) {
        let to = src.join(&name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(orig.join(&name), &to).unwrap();
    }
    let names = files(&src);
    for list in [false, true] {
        let m = mount(&src, &tmp.path().join(format!("mnt-{list}")), &[]);
        let pass = cold_pass(&m, &src, &names, list);
        // Each file's and directory's inode and directory blocks are read again after
        // drop_caches too: as many bytes as opening every file cold reads, measured (not a
        // guess per file, which let a 20 % re-read pass).
        let metadata = lookup_cost(&src, &names);
        assert_read_once(
            &format!("directory order, tree listed first: {list}"),
            &pass,
            metadata + (1 << 20),
        );
    }
}
