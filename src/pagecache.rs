//! The pack's page cache: residency checks (mincore), read-ahead hints (madvise WILLNEED),
//! eviction (posix_fadvise DONTNEED) and pinning (mlock of the shared mapping, which pins the
//! page-cache pages themselves so `drop_caches` and memory pressure cannot evict them).
//!
//! Pinning is checked against available memory (`MemAvailable`) and the cgroup v2 limit
//! (`memory.max` − `memory.current` of the daemon's cgroup) before anything is locked: locked
//! pages count against that cgroup and cannot be reclaimed, so an oversize pin would invite the
//! OOM killer. Pinning runs in the background in 64 MiB steps from the start of the pack (pack
//! order), reporting progress. See `../shared/research/rust-fuse.md` §5.

use anyhow::{Result, bail};
use memmap2::{Advice, Mmap};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Memory left free when checking a pin or warm budget, bytes.
pub const MEMORY_MARGIN: u64 = 512 << 20;
const PAGE: usize = 4096;

/// Parses a size: plain bytes or with a K/M/G/T suffix (powers of 1024), e.g. `512M`, `2G`.
/// `all` gives `None`.
pub fn parse_size(s: &str) -> Result<Option<u64>, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(format!(
                        "unknown size suffix in {s:?} (use K, M, G, T or all)"
                    ));
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    if v.is_nan() || v < 0.0 {
        return Err(format!("not a size: {s:?}"));
    }
    Ok(Some((v * mult as f64) as u64))
}

/// `MemAvailable` from /proc/meminfo, bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Room left under this process's cgroup memory limit, bytes, with the limit file's path;
/// `None` when unlimited or unknown. Reads cgroup v2 (`memory.max − memory.current`, under
/// `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`) and v1 (`memory.limit_in_bytes −
/// memory.usage_in_bytes` under `/sys/fs/cgroup/memory`).
pub fn cgroup_room() -> Option<(u64, String)> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut best: Option<(u64, String)> = None;
    for line in cg.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let candidates: Vec<(String, String)> = if ctrl.is_empty() {
            ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(|root| {
                    (
                        format!("{root}{path}/memory.max"),
                        format!("{root}{path}/memory.current"),
                    )
                })
                .collect()
        } else if ctrl.split(',').any(|c| c == "memory") {
            let d = format!("/sys/fs/cgroup/memory{path}");
            vec![(
                format!("{d}/memory.limit_in_bytes"),
                format!("{d}/memory.usage_in_bytes"),
            )]
        } else {
            continue;
        };
        for (max_p, cur_p) in candidates {
            // "max" (v2) fails to parse; v1 reports ~2^63 for unlimited.
            let (Some(max), Some(cur)) = (read(&max_p), read(&cur_p)) else {
                continue;
            };
            if max >= 1 << 62 {
                continue;
            }
            let room = max.saturating_sub(cur);
            if best.as_ref().is_none_or(|(r, _)| room < *r) {
                best = Some((room, max_p));
            }
        }
    }
    best
}

/// Checks that `bytes` can be pinned: it must fit in `MemAvailable` and under the cgroup limit,
/// with [`MEMORY_MARGIN`] to spare. The error says which limit and by how much.
pub fn check_pin_budget(bytes: u64) -> Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if let Some(avail) = mem_available() {
        if bytes + MEMORY_MARGIN > avail {
            bail!(
                "cannot pin {:.2} GiB: only {:.2} GiB of memory is available (MemAvailable) and {:.2} GiB must stay free; \
                 pin less (--pin SIZE) or free memory",
                gib(bytes),
                gib(avail),
                gib(MEMORY_MARGIN)
            );
        }
    }
    if let Some((room, limit_file)) = cgroup_room() {
        if bytes + MEMORY_MARGIN > room {
            bail!(
                "cannot pin {:.2} GiB: the cgroup limit {limit_file} leaves {:.2} GiB and {:.2} GiB must stay free \
                 (locked pages count against it and cannot be reclaimed); pin less or raise memory.max",
                gib(bytes),
                gib(room),
                gib(MEMORY_MARGIN)
            );
        }
    }
    Ok(())
}

fn page_range(map: &Mmap, r: &Range<u64>) -> Option<Range<usize>> {
    let start = (r.start as usize) / PAGE * PAGE;
    let end = (r.end as usize).min(map.len());
    (end > start).then_some(start..end)
}

/// Whether every page of `r` is resident in the page cache (mincore on the mapping).
pub fn resident(map: &Mmap, r: &Range<u64>) -> bool {
    resident_bytes(map, r)
        >= r.end
            .min(map.len() as u64)
            .saturating_sub(r.start / PAGE as u64 * PAGE as u64)
}

/// Number of resident bytes (whole pages) in `r`.
pub fn resident_bytes(map: &Mmap, r: &Range<u64>) -> u64 {
    let Some(p) = page_range(map, r) else {
        return 0;
    };
    let pages = (p.end - p.start).div_ceil(PAGE);
    let mut vec = vec![0u8; pages];
    // SAFETY: the address range lies inside the live mapping `map` (clamped above) and `vec`
    // has one byte per page of it, as mincore(2) requires.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(p.start) as *mut libc::c_void,
            p.end - p.start,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return 0;
    }
    let full = vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE as u64;
    full.min((p.end - p.start) as u64)
}

/// Turns off read-around on page faults of `map` (`MADV_RANDOM`). Without it a cold fault reads
/// `read_ahead_kb` of the disk around the faulting page (8 MiB on this machine's virtio disk):
/// for a shuffled epoch of 40 KB samples that is 200× over-read. Reads instead ask for exactly
/// the sample ([`will_need`]) and read-ahead in pack order is explicit ([`crate::prefetch`]).
pub fn random_access(map: &Mmap) {
    if let Err(e) = map.advise(Advice::Random) {
        log::warn!("madvise(MADV_RANDOM) on the pack failed: {e}");
    }
}

/// A background thread that brings pack ranges into the page cache, so the FUSE threads never
/// block submitting read-ahead I/O. Ranges are issued in 4 MiB `WILLNEED` steps, in order.
#[derive(Debug)]
pub struct Prefetchd {
    tx: std::sync::mpsc::Sender<Range<u64>>,
}

impl Prefetchd {
    /// Starts the thread for `map`.
    pub fn start(map: Arc<Mmap>) -> Prefetchd {
        let (tx, rx) = std::sync::mpsc::channel::<Range<u64>>();
        let spawned = std::thread::Builder::new()
            .name("loosefs-prefetch".into())
            .spawn(move || {
                const STEP: u64 = 4 << 20;
                for r in rx {
                    let mut off = r.start;
                    while off < r.end {
                        let end = (off + STEP).min(r.end);
                        will_need(&map, &(off..end));
                        off = end;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the prefetch thread: {e}");
        }
        Prefetchd { tx }
    }

    /// Queues `r` for prefetching (never blocks).
    pub fn request(&self, r: Range<u64>) {
        let _ = self.tx.send(r);
    }
}

/// Asks the kernel to read `r` into the page cache asynchronously.
pub fn will_need(map: &Mmap, r: &Range<u64>) {
    if let Some(p) = page_range(map, r) {
        let _ = map.advise_range(Advice::WillNeed, p.start, p.end - p.start);
    }
}

/// Evicts the page-cache pages of pack bytes `r`: first drops them from this process's page
/// tables (pages mapped by any process survive `POSIX_FADV_DONTNEED`), then advises the kernel
/// to drop them. `r` must not overlap the pinned prefix (locked pages cannot be unmapped).
pub fn evict(map: &Mmap, file: &std::fs::File, r: &Range<u64>) -> std::io::Result<()> {
    if let Some(p) = page_range(map, r) {
        // SAFETY: the mapping is a read-only shared map of an immutable file; MADV_DONTNEED only
        // drops page-table entries, and later accesses fault the same bytes back in from the file.
        unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                p.start,
                p.end - p.start,
            )?
        };
    }
    evict_unmapped(file, r)
}

/// Advises the kernel to drop the clean page-cache pages of pack bytes `r` (whole pages only;
/// pages mapped or locked by any process stay).
pub fn evict_unmapped(file: &std::fs::File, r: &Range<u64>) -> std::io::Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the fd is open.
    let rc = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            r.start as i64,
            (r.end - r.start) as i64,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Pins a prefix of the pack in memory with mlock, in the background.
#[derive(Debug, Default)]
pub struct Pinner {
    /// Bytes to pin.
    pub target: AtomicU64,
    /// Bytes pinned so far.
    pub pinned: AtomicU64,
}

impl Pinner {
    /// Starts pinning `[0, bytes)` of `map` on a background thread (64 MiB per mlock call, so
    /// progress is visible). The mapping must stay alive as long as the pin should hold: pages
    /// stay locked while a mapping that locked them exists.
    pub fn start(self: &Arc<Self>, map: Arc<Mmap>, bytes: u64) {
        let bytes = bytes.min(map.len() as u64);
        self.target.store(bytes, Relaxed);
        let me = self.clone();
        std::thread::Builder::new()
            .name("loosefs-pin".into())
            .spawn(move || {
                const STEP: u64 = 64 << 20;
                let mut off = 0;
                while off < bytes {
                    let len = STEP.min(bytes - off);
                    // SAFETY: [off, off + len) lies inside the mapping, which this thread keeps
                    // alive through its Arc; mlock reads nothing through the pointer itself.
                    let rc = unsafe {
                        libc::mlock(
                            map.as_ptr().add(off as usize) as *const libc::c_void,
                            len as usize,
                        )
                    };
                    if rc != 0 {
                        log::error!(
                            "mlock of pack bytes {off}..{} failed: {}",
                            off + len,
                            std::io::Error::last_os_error()
                        );
                        return;
                    }
                    off += len;
                    me.pinned.store(off, Relaxed);
                }
                log::info!("pinned {bytes} bytes of the pack");
            })
            .ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("all"), Ok(None));
        assert_eq!(parse_size("4096"), Ok(Some(4096)));
        assert_eq!(parse_size("512M"), Ok(Some(512 << 20)));
        assert_eq!(parse_size("2g"), Ok(Some(2 << 30)));
        assert_eq!(parse_size("1.5K"), Ok(Some(1536)));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn memory_readings_are_sane() {
        let avail = mem_available().expect("MemAvailable on Linux");
        assert!(avail > 0);
        assert!(check_pin_budget(u64::MAX / 4).is_err());
        assert!(check_pin_budget(1 << 20).is_ok());
    }
}
