//! Shared helpers for the integration tests: the loosefs binary, a generated tree of real
//! JPEGs, the real ImageNet sample when present, and mount helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A test's prerequisite (`what`) is missing: under `CI=true` the test fails saying so;
/// elsewhere it prints `SKIPPED: what` and the caller returns (libtest captures the line, so
/// `scripts/test.sh` runs under CI=true, where nothing is skipped silently).
pub fn missing_prerequisite(what: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {what}: the test cannot run"
    );
    eprintln!("SKIPPED: {what}");
}

/// Shuffles `v` by a fixed permutation of `seed` (an LCG), as a sampler's.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut x = seed;
    for i in (1..v.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, ((x >> 33) % (i as u64 + 1)) as usize);
    }
}

/// Bytes of `pack` after its sample data: the index and the zip's tail.
pub fn index_bytes(pack: &Path) -> u64 {
    std::fs::metadata(pack).unwrap().len()
        - loosefs::pack::reader::Pack::open(pack)
            .unwrap()
            .totals()
            .data_end
}

/// Path of the built `loosefs` binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_loosefs")
}

/// Runs `loosefs ARGS`, returning its output.
pub fn loosefs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(bin());
    for a in args {
        c.arg(a);
    }
    c.output().expect("run loosefs")
}

/// The tests' data: `../shared/data` beside the checkout (CI's machines), else the corpus
/// `scripts/make-test-data.py` made, laid out the same way (`$LOOSEFS_TEST_DATA`, set by
/// scripts/test.sh: `imagenet-sample/`, 1,000 JPEGs cut from real photographs, and
/// `formats/`), else none.
/// `LOOSEFS_TEST_CLONE_ALONE=1` hides `../shared` as a user's clone lacks it (scripts/test.sh's
/// clone-alone pass).
pub fn data_root() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    let alone = std::env::var("LOOSEFS_TEST_CLONE_ALONE").as_deref() == Ok("1");
    if p.is_dir() && !alone {
        return Some(p);
    }
    let made = PathBuf::from(std::env::var_os("LOOSEFS_TEST_DATA")?);
    made.is_dir().then_some(made)
}

/// The ImageNet sample of [`data_root`] (the real one, or the corpus' 1,000 JPEGs), when there.
pub fn shared_sample() -> Option<PathBuf> {
    let p = data_root()?.join("imagenet-sample");
    p.is_dir().then_some(p)
}

/// Encodes a w×h JPEG (RGB gradient with noise, or grey) with the jpeg-encoder crate.
pub fn encode_jpeg(w: u16, h: u16, grey: bool, seed: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let enc = jpeg_encoder::Encoder::new(&mut out, 90);
    let mut s = seed.wrapping_mul(2654435761).max(1);
    let mut px = Vec::new();
    for y in 0..h as u32 {
        for x in 0..w as u32 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let r = (x * 255 / w as u32) as u8;
            let g = (y * 255 / h as u32) as u8;
            let b = (s & 0xff) as u8;
            if grey {
                px.push(r / 2 + g / 2);
            } else {
                px.extend_from_slice(&[r, g, b]);
            }
        }
    }
    let ct = if grey {
        jpeg_encoder::ColorType::Luma
    } else {
        jpeg_encoder::ColorType::Rgb
    };
    enc.encode(&px, w, h, ct).expect("encode jpeg");
    out
}

/// Writes a small ImageFolder-like tree of real JPEGs into `dir`: 3 classes, a grey sample, a
/// non-JPEG file, a nested directory and an empty directory.
pub fn make_tree(dir: &Path) {
    for c in 0..3u32 {
        let d = dir.join(format!("class_{c}"));
        std::fs::create_dir_all(&d).unwrap();
        for k in 0..4u32 {
            let jpg = encode_jpeg(64 + 8 * k as u16, 48 + 4 * c as u16, k == 3, c * 10 + k);
            std::fs::write(d.join(format!("img_{k}.JPEG")), jpg).unwrap();
        }
    }
    std::fs::write(dir.join("class_0/notes.txt"), b"not an image\n").unwrap();
    std::fs::create_dir_all(dir.join("class_1/nested/deeper")).unwrap();
    std::fs::write(
        dir.join("class_1/nested/deeper/x.JPEG"),
        encode_jpeg(33, 17, false, 99),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("empty_class")).unwrap();
}

/// The tree the mount tests use: the real sample when present, else a generated one.
pub fn dataset(tmp: &Path) -> PathBuf {
    if let Some(p) = shared_sample() {
        return p;
    }
    let d = tmp.join("generated");
    make_tree(&d);
    d
}

/// True when mounting can work here (root and /dev/fuse). Mount tests are `#[ignore]`d by
/// default and run with `--include-ignored` by scripts/test.sh when this holds.
pub fn can_mount() -> bool {
    nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists()
}

/// Panics loudly if mounting is impossible here (the test then fails instead of passing).
/// Returns the test's [`Timeout`]: keep it for the test's life (`let _t = require_mount();`).
#[must_use = "the timeout ends when dropped"]
pub fn require_mount() -> Timeout {
    assert!(can_mount(), "this test mounts: it needs root and /dev/fuse");
    Timeout::start()
}

/// A watchdog for one test: if the test has not ended within `$LOOSEFS_TEST_TIMEOUT` seconds
/// (default 900), it prints the test's name and aborts the test binary, so a hung FUSE read
/// fails the run with a name instead of hanging it. Dropping it ends the watch (the watcher
/// sees its channel close).
pub struct Timeout {
    _watch: std::sync::mpsc::Sender<()>,
}

impl Timeout {
    /// Starts watching the calling test (named by its thread).
    pub fn start() -> Timeout {
        let secs = std::env::var("LOOSEFS_TEST_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(900);
        let name = std::thread::current()
            .name()
            .unwrap_or("a test")
            .to_string();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(secs))
            {
                eprintln!("TIMEOUT: {name} ran longer than {secs} s; aborting the test binary");
                std::process::abort();
            }
        });
        Timeout { _watch: tx }
    }
}

/// Runs `f` on its own thread; the receiver gets its result. `recv_timeout` on it bounds a
/// call that may hang (a read of a mount whose daemon died); after `limit` the result is
/// dropped and `recv` fails.
pub fn with_timeout<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
    limit: Duration,
) -> TimedResult<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    TimedResult { rx, limit }
}

/// The result of [`with_timeout`].
pub struct TimedResult<T> {
    rx: std::sync::mpsc::Receiver<T>,
    limit: Duration,
}

impl<T> TimedResult<T> {
    /// The result, or an error when the call did not end within its limit.
    pub fn recv(self) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(self.limit)
    }
}

/// A mounted pack; unmounts (lazily if needed) on drop.
pub struct Mounted {
    pub mnt: PathBuf,
    pub pid: i32,
    pub log: PathBuf,
}

/// Mounts `pack` at `mnt` (created) with `extra` args; returns the daemon pid.
pub fn mount(pack: &Path, mnt: &Path, extra: &[&str]) -> Mounted {
    std::fs::create_dir_all(mnt).unwrap();
    let log = mnt.with_extension("log");
    let out = Command::new(bin())
        .arg("mount")
        .arg(pack)
        .arg(mnt)
        .arg("--log")
        .arg(&log)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mount failed: {err}");
    let pid = err
        .split("daemon pid ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {err:?}"));
    Mounted {
        mnt: mnt.to_path_buf(),
        pid,
        log,
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
        }
        // The daemon may have exited already and its pid been reused: kill only a process that
        // is still this mount's daemon (its command line names the mountpoint).
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let ours = cmdline
            .split(|&b| b == 0)
            .any(|a| a == self.mnt.as_os_str().as_encoded_bytes());
        if ours {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Whether `mnt` is a mount point now (from /proc/self/mountinfo).
pub fn is_mounted(mnt: &Path) -> bool {
    let abs = std::fs::canonicalize(mnt.parent().unwrap())
        .unwrap()
        .join(mnt.file_name().unwrap());
    loosefs::mount::mount_fstype(&abs).is_some()
}

/// Whether process `pid` is alive (a zombie counts as exited).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Stops process `pid` (SIGSTOP) and returns once every one of its threads is stopped
/// (state `T` in `/proc/PID/task/*/stat`; io_uring's kernel workers, `iou-*`, take no
/// signal and are left out). `kill` returns before the threads stop: a request sent right
/// after it may still be answered. Panics after 30 s.
pub fn stop(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            stat.is_empty() || comm.starts_with("iou-") || state.starts_with(['T', 't', 'Z'])
        })
    };
    let t = Instant::now();
    while !stopped() {
        assert!(t.elapsed() < Duration::from_secs(30), "{pid} never stopped");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits up to `secs` for `pid` to exit; true if it did.
pub fn wait_exit(pid: i32, secs: u64) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Packs [`dataset`] into `tmp/d.pack`; returns (source, pack).
pub fn packed(tmp: &Path) -> (PathBuf, PathBuf) {
    packed_with(tmp, &[])
}

/// [`packed`] with extra `loosefs pack` flags (e.g. `--align 4096`).
pub fn packed_with(tmp: &Path, flags: &[&str]) -> (PathBuf, PathBuf) {
    let src = dataset(tmp);
    let out = tmp.join("d.pack");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"pack", &src, &out];
    args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
    let o = loosefs(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (src, out)
}

/// Relative paths of the regular files under `root`, depth first with names sorted at each
/// level (pack order).
pub fn files(root: &Path) -> Vec<String> {
    walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            e.path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Pillow's RGB decode of the JPEG at `path`, at DCT scale 1/`denom` (`Image.draft`, libjpeg's
/// scaled IDCT), through the project's Python venv (`scripts/python-env.sh`): an oracle
/// independent of the daemon's decoder. `truncated`: decode what libjpeg recovers of a
/// truncated file (`ImageFile.LOAD_TRUNCATED_IMAGES`). Returns (width, height, RGB pixels).
/// Panics when the venv cannot run Pillow.
pub fn pillow_rgb(path: &Path, denom: u32, truncated: bool) -> (u32, u32, Vec<u8>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = Command::new(root.join("scripts/python-env.sh"))
        .output()
        .expect("scripts/python-env.sh");
    assert!(
        venv.status.success(),
        "{}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let py = PathBuf::from(String::from_utf8(venv.stdout).unwrap().trim()).join("bin/python");
    let script = r#"
import sys
from PIL import Image, ImageFile
ImageFile.LOAD_TRUNCATED_IMAGES = sys.argv[3] == "1"
im = Image.open(sys.argv[1])
d = int(sys.argv[2])
if d > 1:
    im.draft("RGB", (-(-im.width // d), -(-im.height // d)))
im = im.convert("RGB")
sys.stdout.buffer.write(b"%d %d\n" % im.size + im.tobytes())
"#;
    let o = Command::new(py)
        .args(["-c", script])
        .arg(path)
        .arg(denom.to_string())
        .arg(if truncated { "1" } else { "0" })
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "Pillow: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let nl = o.stdout.iter().position(|&b| b == b'\n').unwrap();
    let head = String::from_utf8_lossy(&o.stdout[..nl]).into_owned();
    let mut it = head.split(' ').map(|x| x.parse::<u32>().unwrap());
    let (w, h) = (it.next().unwrap(), it.next().unwrap());
    (w, h, o.stdout[nl + 1..].to_vec())
}

/// A temp dir on the disk the build is on (`CARGO_TARGET_TMPDIR`), not on `/tmp`, which may be
/// a tmpfs (Debian 13's default): tests that evict pages and count device reads need files the
/// kernel can drop and read back from a device.
pub fn disk_tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir in CARGO_TARGET_TMPDIR")
}

/// Options of an in-process server (no mount): read-ahead windows of 64/256 MiB,
/// `push_ahead` samples pushed, a 256 MiB decode cache on 2 threads, owner uid 1000.
pub fn server_options(push_ahead: usize) -> loosefs::fs::FsOptions {
    use loosefs::decode::DecodeOptions;
    use loosefs::readahead::ReadAheadOptions;
    let base = loosefs::fs::FsOptions::in_process();
    loosefs::fs::FsOptions {
        readahead: ReadAheadOptions {
            window_max: 64 << 20,
            push_ahead,
            order_window: 256 << 20,
            ..base.readahead
        },
        mountpoint: "/test".into(),
        threads: 4,
        owner: 1000,
        decode: DecodeOptions {
            cache_bytes: 256 << 20,
            frame_cache_bytes: 256 << 20,
            threads: 2,
            ahead: 8,
            ..base.decode
        },
        ..base
    }
}

/// Polls `done` (every 5 ms) until it holds; fails the test naming `what` once `secs` seconds
/// passed. The one way tests wait for something another thread or process does.
#[allow(dead_code)]
pub fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(secs),
            "not after {secs} s: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
