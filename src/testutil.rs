//! Helpers shared by the in-process tests: a small tmpfs to stand in for a full disk, and
//! deterministic bytes no compressor shrinks.

use std::path::{Path, PathBuf};

/// A tmpfs of `size` (mount(8)'s `size=`, e.g. `"32m"`) mounted at a new directory `dir/name`,
/// unmounted (lazily) when dropped. Needs root: panics otherwise, so callers are `#[ignore]`d
/// root-only tests.
pub struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    /// Mounts it.
    pub fn mount(dir: &Path, name: &str, size: &str) -> SmallTmpfs {
        let at = dir.join(name);
        std::fs::create_dir(&at).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &at,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .expect("mount tmpfs (root needed)");
        SmallTmpfs(at)
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `n` bytes of a xorshift64 sequence started from `seed` (made odd): deterministic, no two
/// stretches alike, incompressible.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A WebDataset shard (an uncompressed GNU tar) of samples `ids`: per sample `s{i:04}.jpg`
/// (`noise` of `jpg_len(i)` bytes) and `s{i:04}.cls` (the label `i % classes` as text).
pub fn wds_shard(
    ids: std::ops::Range<usize>,
    jpg_len: impl Fn(usize) -> usize,
    classes: usize,
) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for i in ids {
        for (ext, data) in [
            ("jpg", noise(i as u64 + 9, jpg_len(i))),
            ("cls", (i % classes).to_string().into_bytes()),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("s{i:04}.{ext}"), &data[..])
                .expect("a tar member in memory");
        }
    }
    b.into_inner().expect("a tar in memory")
}

/// A test's prerequisite (`what`) is missing: under `CI=true` the test fails saying so;
/// elsewhere it prints `SKIPPED: what` (shown by `--nocapture` or a failure's output) and the
/// caller returns.
pub fn missing_prerequisite(what: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {what}: the test cannot run"
    );
    eprintln!("SKIPPED: {what}");
}

/// The tests' data, as tests/common's `data_root`: `../shared/data` beside the checkout (unless
/// `LOOSEFS_TEST_CLONE_ALONE=1` hides it), else the corpus scripts/make-test-data.py made
/// (`$LOOSEFS_TEST_DATA`), laid out the same way; else none.
pub fn data_root() -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    let alone = std::env::var("LOOSEFS_TEST_CLONE_ALONE").as_deref() == Ok("1");
    if p.is_dir() && !alone {
        return Some(p);
    }
    let made = std::path::PathBuf::from(std::env::var_os("LOOSEFS_TEST_DATA")?);
    made.is_dir().then_some(made)
}
