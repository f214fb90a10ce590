//! `loosefs-request-cost`: what one FUSE request costs, per kind, measured from a client (issue
//! 25's first step). Each kind is a syscall loop that makes the kernel send exactly one request
//! per iteration on a loosefs mount (on another file system, the same loop is that file system's
//! cost of the same call):
//! - `ioctl`: `ioctl(TCGETS)` on an open file (what CPython's `open()` does via `isatty`):
//!   FUSE_IOCTL every time (the kernel remembers no refusal);
//! - `lookup`: `stat` of a new name that does not exist each time: one FUSE_LOOKUP each;
//! - `getattr`: `statx(AT_STATX_FORCE_SYNC)` of an open file: FUSE_GETATTR every time;
//! - `read4k` / `read128k`: `posix_fadvise(DONTNEED)` then `pread` of 4 KiB (readahead off:
//!   `FADV_RANDOM`) or 128 KiB at offset 0: one FUSE_READ of that size (`--warm`: no DONTNEED, a
//!   page-cache hit, no request);
//! - `open`: `open` + `close` of a file: FUSE_OPEN (+ FLUSH, RELEASE) unless the mount answers
//!   opens without a request;
//! - `dontneed`: the `posix_fadvise(DONTNEED)` alone (what the read loops pay besides the READ).
//!
//! Usage: `loosefs-request-cost --dir DIR [--threads N] [--iters N] [--pid DAEMON] [--warm]
//! [--ops ioctl,lookup,...]`. Prints one JSON line per kind: wall ns per call (per thread),
//! calls/s (all threads), the client's CPU ns per call (user + system, from `getrusage`: the
//! kernel's FUSE work on the caller's side included) and, with `--pid`, the daemon's CPU ns and
//! context switches per call (from `/proc/PID/task/*/{schedstat,status}`).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Up to `n` regular files under `dir` of at least `min` bytes (depth first, names sorted).
fn files_at_least(dir: &std::path::Path, min: u64, n: usize, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if out.len() >= n {
            return;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_file() && m.len() >= min {
            out.push(p);
        } else if m.is_dir() {
            files_at_least(&p, min, n, out);
        }
    }
}

/// (CPU ns, context switches) of every thread of process `pid`: the scheduler's own figures
/// (`schedstat`: ns on CPU; `status`: voluntary and involuntary switches).
fn daemon_usage(pid: u32) -> (u64, u64) {
    let (mut cpu, mut cs) = (0u64, 0u64);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for t in tasks.flatten() {
        if let Ok(st) = std::fs::read_to_string(t.path().join("schedstat")) {
            cpu += st
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
        if let Ok(status) = std::fs::read_to_string(t.path().join("status")) {
            for l in status.lines() {
                if l.contains("ctxt_switches:") {
                    cs += l
                        .split_whitespace()
                        .last()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                }
            }
        }
    }
    (cpu, cs)
}

fn client_cpu_ns() -> u64 {
    // SAFETY: a plain C struct, all zeroes valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// One call of kind `op` on `file` (open as `f`); `k` varies the missing name of `lookup`.
fn call(
    op: &str,
    f: &std::fs::File,
    file: &CString,
    missing: &CString,
    warm: bool,
    buf: &mut [u8],
) {
    let fd = f.as_raw_fd();
    // SAFETY: plain syscalls on an open descriptor and NUL-terminated paths; buffers sized.
    unsafe {
        match op {
            "ioctl" => {
                let mut t: libc::termios = std::mem::zeroed();
                libc::ioctl(fd, libc::TCGETS, &mut t);
            }
            "lookup" => {
                let mut st: libc::stat = std::mem::zeroed();
                libc::stat(missing.as_ptr(), &mut st);
            }
            "dontneed" => {
                libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
            }
            "getattr" => {
                let mut stx: libc::statx = std::mem::zeroed();
                libc::statx(
                    fd,
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                    libc::STATX_BASIC_STATS,
                    &mut stx,
                );
            }
            "read4k" | "read128k" => {
                if !warm {
                    libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
                }
                libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            }
            "open" => {
                let g = libc::open(file.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if g >= 0 {
                    libc::close(g);
                }
            }
            _ => panic!("unknown op {op}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(arg(&args, "--dir").expect("--dir DIR"));
    let threads: usize = arg(&args, "--threads").map_or(1, |v| v.parse().expect("--threads N"));
    let iters: u64 = arg(&args, "--iters").map_or(20_000, |v| v.parse().expect("--iters N"));
    let pid: Option<u32> = arg(&args, "--pid").map(|v| v.parse().expect("--pid PID"));
    let warm = args.iter().any(|a| a == "--warm");
    let ops = arg(&args, "--ops")
        .unwrap_or_else(|| "ioctl,lookup,getattr,dontneed,read4k,read128k,open".into());
    // A file of its own per thread (threads sharing one would contend on its page cache).
    let mut files = Vec::new();
    files_at_least(&dir, 128 << 10, threads, &mut files);
    assert!(
        files.len() == threads,
        "{threads} files of at least 128 KiB under --dir"
    );
    for op in ops.split(',') {
        let len = if op == "read128k" { 128 << 10 } else { 4096 };
        let (d0, c0, t0) = (pid.map(daemon_usage), client_cpu_ns(), Instant::now());
        std::thread::scope(|s| {
            for (k, file) in files.iter().enumerate() {
                let file = file.clone();
                let dir = dir.clone();
                s.spawn(move || {
                    let f = std::fs::File::open(&file).expect("open");
                    if op == "read4k" {
                        // SAFETY: advice on an open descriptor.
                        unsafe {
                            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM)
                        };
                    }
                    let path = CString::new(file.as_os_str().as_encoded_bytes()).expect("path");
                    let missing = CString::new(
                        dir.join(format!("no-such-file-{k}"))
                            .as_os_str()
                            .as_encoded_bytes(),
                    )
                    .expect("path");
                    let mut buf = vec![0u8; len];
                    for i in 0..iters {
                        // A new name each time: a mount may cache a negative entry.
                        let missing = if op == "lookup" {
                            let n = dir.join(format!("no-such-file-{k}-{i}"));
                            CString::new(n.as_os_str().as_encoded_bytes()).expect("path")
                        } else {
                            missing.clone()
                        };
                        call(op, &f, &path, &missing, warm, &mut buf);
                    }
                });
            }
        });
        let wall = t0.elapsed().as_nanos() as f64;
        let calls = (iters * threads as u64) as f64;
        let client = (client_cpu_ns() - c0) as f64 / calls;
        let daemon = match (pid, d0) {
            (Some(p), Some((cpu0, cs0))) => {
                let (cpu1, cs1) = daemon_usage(p);
                format!(
                    ", \"daemon_cpu_ns_per_call\": {:.0}, \"daemon_switches_per_call\": {:.2}",
                    (cpu1 - cpu0) as f64 / calls,
                    (cs1 - cs0) as f64 / calls
                )
            }
            _ => String::new(),
        };
        println!(
            "{{\"op\": \"{op}\", \"threads\": {threads}, \"warm\": {warm}, \"calls\": {calls}, \"wall_ns_per_call\": {:.0}, \"calls_per_s\": {:.0}, \"client_cpu_ns_per_call\": {client:.0}{daemon}}}",
            wall * threads as f64 / calls,
            calls / wall * 1e9
        );
    }
}
