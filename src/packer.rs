//! `loosefs pack`: turns a directory tree (or a foreign zip archive) into a pack.
//!
//! Design: list the source first ([`crate::source`]: pack order, skipped entries), then read file contents in parallel batches on a
//! rayon pool (CRC-32 and JPEG header probe happen there too) while the calling thread writes
//! the previous batch in order. The pack is written to a temp file beside OUT and renamed into
//! place only when complete, so an interrupted or failed pack leaves nothing named OUT.

use crate::pack::jpeg::{self, JpegInfo};
use crate::pack::writer::{PackWriter, ROOT};
use crate::source::{Item, ItemKind, Skipped, Source};

mod foreign;
use crate::progress::{Meter, Progress, Unit};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Options of `loosefs pack`.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Reader threads (0 = number of CPUs).
    pub jobs: usize,
    /// Alignment of member data in bytes (power of two, 1..=32768).
    pub align: u32,
    /// Follow symbolic links instead of skipping them.
    pub follow_links: bool,
    /// Replace OUT if it exists.
    pub force: bool,
    /// How progress is shown.
    pub progress: Progress,
    /// How a source in another packed format is read.
    pub source: crate::open::OpenOptions,
}

/// What `pack` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackReport {
    /// Files packed.
    pub files: u64,
    /// Directories packed (the root not counted).
    pub dirs: u64,
    /// Sum of sample sizes, bytes.
    pub bytes: u64,
    /// Files whose header probes as a JPEG (their dimensions are in the index).
    pub jpegs: u64,
    /// Size of the pack file, bytes.
    pub pack_bytes: u64,
    /// Entries not packed, each with the reason (symlinks, special files, non-UTF-8 names).
    pub skipped: Skipped,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// A source item as the reader threads hand it to the writer.
enum Loaded {
    /// A directory.
    Dir,
    /// A file read whole, its CRC-32 and JPEG probe done off the writing thread.
    Whole {
        data: Vec<u8>,
        crc: u32,
        jpeg: Option<JpegInfo>,
    },
    /// A file over [`STREAM_OVER`] bytes, streamed by the writer itself.
    Stream(u64),
}

/// Files larger than this are not read whole by the reader threads but streamed by the
/// writer (1 MiB at a time), so packing a file of any size costs no more memory, bytes.
const STREAM_OVER: u64 = 64 << 20;

/// Batches of item indices: up to 256 files or 64 MiB each, directories included in order.
fn batches(items: &[Item]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes, mut files) = (0, 0u64, 0);
    for (i, it) in items.iter().enumerate() {
        if let ItemKind::File { size: n, .. } = it.kind {
            bytes += n;
            files += 1;
        }
        if bytes >= 64 << 20 || files >= 256 {
            out.push(start..i + 1);
            (start, bytes, files) = (i + 1, 0, 0);
        }
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
}

fn load(source: &Source, item: &Item) -> Result<Loaded> {
    Ok(match item.kind {
        ItemKind::Dir => Loaded::Dir,
        ItemKind::File { size, .. } if size > STREAM_OVER => Loaded::Stream(size),
        ItemKind::File { .. } => {
            let data = source.read(item)?;
            let crc = crc32fast::hash(&data);
            let jpeg = jpeg::probe(&data);
            Loaded::Whole { data, crc, jpeg }
        }
    })
}

/// Counts of what was written: (files, directories, sample bytes, JPEGs).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    files: u64,
    dirs: u64,
    bytes: u64,
    jpegs: u64,
}

/// The directory OUT goes in. Errors: OUT exists without `force`, its directory is missing.
fn out_dir_of(out: &Path, force: bool) -> Result<PathBuf> {
    use crate::exit_code::{ExitKind::Usage, refuse};
    if !force && std::fs::symlink_metadata(out).is_ok() {
        return Err(refuse(
            Usage,
            format!(
                "{} already exists (use --force to replace it)",
                out.display()
            ),
        ));
    }
    let out_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !out_dir.is_dir() {
        return Err(refuse(
            Usage,
            format!(
                "directory {} for the output pack does not exist",
                out_dir.display()
            ),
        ));
    }
    Ok(out_dir)
}

/// The locked temp file `.OUT.XXXXXX.tmp` in `out_dir` the pack is written to; leftovers of
/// killed packs beside it are removed first.
fn temp_pack(out_dir: &Path, out: &Path) -> Result<tempfile::NamedTempFile> {
    let out_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{out_name}.");
    remove_stale_temp_files(out_dir, &prefix);
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(TEMP_SUFFIX)
        .permissions(std::fs::Permissions::from_mode(0o666 & !umask()))
        .tempfile_in(out_dir)
        .with_context(|| format!("cannot create a temp file in {}", out_dir.display()))?;
    // Held until the pack is renamed into place or removed: a temp file nobody holds is a
    // leftover of a pack that was killed (SIGKILL, a crash, a power cut).
    flock(tmp.as_file(), libc::LOCK_EX | libc::LOCK_NB)
        .with_context(|| format!("cannot lock {}", tmp.path().display()))?;
    Ok(tmp)
}

/// This process's file mode creation mask (`Umask:` of /proc/self/status; 0o022 where it
/// cannot be read): a pack gets the mode any new file would (0644 under the usual umask),
/// not the temp file's 0600, so a web server or another user can read it.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line.split_whitespace().nth(1)?, 8).ok()
        })
        .unwrap_or(0o022)
}

/// A flag raised by SIGINT, SIGTERM or SIGHUP.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// Adds one loaded item to the pack under `parent`; returns its node.
fn add(
    w: &mut PackWriter<std::fs::File>,
    source: &Source,
    item: &Item,
    parent: usize,
    loaded: Loaded,
    n: &mut Counts,
) -> Result<usize> {
    match loaded {
        Loaded::Dir => {
            n.dirs += 1;
            w.add_dir(parent, &item.name, item.meta).map_err(Into::into)
        }
        Loaded::Whole { data, crc, jpeg } => {
            (n.files, n.bytes) = (n.files + 1, n.bytes + data.len() as u64);
            w.add_file(parent, &item.name, item.meta, &data, crc, jpeg)
                .map_err(Into::into)
        }
        Loaded::Stream(size) => {
            (n.files, n.bytes) = (n.files + 1, n.bytes + size);
            source.with_reader(item, |r| {
                Ok(w.add_file_from(parent, &item.name, item.meta, size, r)?)
            })
        }
    }
    .with_context(|| format!("cannot add {} to the pack", item.path.display()))
}

/// Reads the source's items in parallel batches on `pool` and writes them in order to `w`.
/// Errors: a read or write failure, `stop` raised (an interrupt).
fn write_items(
    w: &mut PackWriter<std::fs::File>,
    source: &Source,
    pool: rayon::ThreadPool,
    meter: &Meter,
    stop: &Arc<AtomicBool>,
    out: &Path,
) -> Result<Counts> {
    let (items, t0) = (&source.items, Instant::now());
    let mut node_of = vec![0usize; items.len()];
    let mut n = Counts::default();
    let plan = batches(items);
    std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Loaded>>>(1);
        let stop_reader = stop.clone();
        s.spawn(move || {
            for range in plan {
                if stop_reader.load(Ordering::Relaxed) {
                    break;
                }
                let loaded: Result<Vec<_>> = pool.install(|| {
                    use rayon::prelude::*;
                    items[range].par_iter().map(|it| load(source, it)).collect()
                });
                if tx.send(loaded).is_err() {
                    break;
                }
            }
        });
        let mut next = 0usize;
        for batch in rx {
            for loaded in batch? {
                let item = &items[next];
                let parent = item.parent.map_or(ROOT, |p| node_of[p]);
                let node = add(w, source, item, parent, loaded, &mut n)?;
                n.jpegs += u64::from(w.is_jpeg(node));
                node_of[next] = node;
                next += 1;
            }
            meter.set(n.bytes);
            let secs = t0.elapsed().as_secs_f64().max(1e-9);
            meter.set_files(n.files, n.files as f64 / secs);
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted; {} was not written", out.display());
            }
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted; {} was not written", out.display());
        }
        Ok(())
    })?;
    Ok(n)
}

/// Packs directory (or zip archive) `src` into a new pack at `out`.
///
/// Errors (each names the file): `src` missing, unreadable, or a zip with escaping names; `out` existing
/// without `force`; the directory of `out` missing; any read or write failure; an interrupt
/// (SIGINT/SIGTERM). On error the temp file is removed and `out` is untouched.
pub fn pack_dir(src: &Path, out: &Path, opts: &PackOptions) -> Result<PackReport> {
    let t0 = Instant::now();
    let out_dir = out_dir_of(out, opts.force)?;
    // A dataset of another format is walked as a mount opens it; a tree or zip as it is.
    let source = if Source::is_foreign(src, opts.source.format)? {
        let s = foreign::walk(src, &opts.source, opts.progress)?;
        s.check_reserved()?;
        s
    } else {
        Source::open(src, out, opts.follow_links, opts.progress)?
    };
    let total: u64 = (source.items.iter())
        .map(|i| match i.kind {
            ItemKind::File { size, .. } => size,
            ItemKind::Dir => 0,
        })
        .sum();
    let tmp = temp_pack(&out_dir, out)?;
    let stop = stop_flag()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs)
        .build()?;
    let meter = opts.progress.meter("pack", Unit::Bytes, Some(total));
    let mut w = PackWriter::new(tmp.as_file().try_clone()?, opts.align, source.root)?;
    let n = write_items(&mut w, &source, pool, &meter, &stop, out)?;
    let file = w
        .finish()
        .with_context(|| format!("cannot finish {}", out.display()))?;
    file.sync_all()?;
    drop(file);
    let pack_bytes = tmp.as_file().metadata()?.len();
    if opts.force {
        tmp.persist(out)
            .with_context(|| format!("cannot rename the finished pack to {}", out.display()))?;
    } else {
        tmp.persist_noclobber(out).with_context(|| {
            format!(
                "cannot rename the finished pack to {} (does it exist now?)",
                out.display()
            )
        })?;
    }
    if let Ok(d) = std::fs::File::open(&out_dir) {
        let _ = d.sync_all();
    }
    meter.finish_and_clear();
    Ok(PackReport {
        files: n.files,
        dirs: n.dirs,
        bytes: n.bytes,
        jpegs: n.jpegs,
        pack_bytes,
        skipped: source.skipped.clone(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Suffix of the temp file a pack is written to (`.OUT.XXXXXX.tmp` beside OUT).
const TEMP_SUFFIX: &str = ".tmp";

/// `flock(2)` on `file`. Errors: the lock is held elsewhere (`LOCK_NB`) or not supported.
fn flock(file: &std::fs::File, op: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock only takes the fd of an open file and an integer operation.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes temp files `dir/PREFIX*.tmp` that no running pack holds (see the lock taken on a
/// pack's own temp file): leftovers of packs of the same OUT that were killed.
fn remove_stale_temp_files(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(prefix) || !name.ends_with(TEMP_SUFFIX) {
            continue;
        }
        let path = e.path();
        let Ok(f) = std::fs::File::open(&path) else {
            continue;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() && std::fs::remove_file(&path).is_ok() {
            crate::eprintln_lossy!(
                "removed {}, left by an earlier pack of the same output that was killed",
                path.display()
            );
        }
    }
}
