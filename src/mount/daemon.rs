//! The daemon as steps, in the order [`super::serve`] takes them: the filesystem built from the
//! opened source ([`build`]), the descriptors counted and the ring prepared ([`transport`]),
//! the kernel's connection opened and wired to the filesystem ([`connect`]), readiness told
//! ([`announce`]), and, once the session has ended, the leftovers cleared ([`finish`]).
//! Each step reads in one screen; a `/dev/fd/N` daemon (a handed-over connection) takes the
//! same steps, only [`connect`] and [`finish`] telling it apart.

use super::metrics_endpoint;
use super::session::{fs_name, open_session, set_read_ahead};
use super::{DaemonOptions, Transport};
use crate::exit_code::{ExitKind, refuse};
use crate::fuse::LooseFs;
use crate::open::Dataset;
use crate::view::Views;
use anyhow::{Context, Result};
use std::io::Write;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The filesystem serving a source, and what the later steps need of the source.
pub(super) struct Built {
    /// The filesystem (shared by the transports, the metrics endpoint and the signal loop).
    pub server: Arc<crate::fs::Fs>,
    /// The source's path or URL.
    pub path: PathBuf,
    /// The owner every file shows (the source's, or its cache directory's).
    pub owner: std::fs::Metadata,
    /// A native pack's file, to lease once the mount is up.
    pub lease_file: Option<std::fs::File>,
}

/// Tunes glibc's allocator for what this mount allocates. Decoded images (hundreds of KiB
/// each) and decompressed chunks (MiBs) are allocated and freed all the time: a fixed mmap
/// threshold gives their memory back to the system on free, so the daemon's RSS follows the
/// decoded and chunk caches instead of the allocator's high-water mark (glibc raises a dynamic
/// threshold to each freed mapping's size, up to 32 MiB, after which freed chunks stay in its
/// arenas). 4 MiB without views keeps READ replies (at most 1 MiB) off mmap. Call before any
/// other thread starts.
pub(super) fn tune_allocator(views: Views) {
    let threshold = if views.any() { 128 << 10 } else { 4 << 20 };
    // SAFETY: mallopt only tunes glibc's allocator; no other thread allocates yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
    }
}

/// The filesystem of `pack` for a mount at `mnt`: the views this kind shows of those asked
/// ([`Dataset::views`]), its catalog and storage ([`Dataset::opened`]), the owner its files
/// show. With `--allow-other`, a directory served in place must have one owner throughout,
/// and changed names are answered only while that owner keeps them.
///
/// Errors: the views or the source (see [`Dataset::views`], [`Dataset::opened`]), or a tree of
/// several owners under `--allow-other`.
pub(super) fn build(pack: Dataset, mnt: &Path, opts: &DaemonOptions) -> Result<Built> {
    let path = pack.path().to_path_buf();
    let in_place = pack.serves_files_in_place();
    let views = pack.views(opts.views)?;
    let server_options = opts.fs_options(mnt);
    let opened = pack
        .opened(views, opts.open.chunk_cache)
        .context("cannot open the pack for serving")?;
    // Files are owned by the source's owner (a remote source's: its cache directory's). A
    // native pack is leased (a writer opening it is noticed); a foreign dataset's files are
    // checked by size and mtime when mounted.
    let owner = opened.owner.clone();
    if opts.allow_other && in_place {
        super::same_owner_throughout(&path, &owner)?;
    }
    let lease_file = opened.lease.as_ref().map(|f| f.try_clone()).transpose()?;
    let server = Arc::new(super::compose::compose(opened, views, server_options)?);
    if opts.allow_other
        && let Some(c) = server.changes()
    {
        c.require_owner(owner.uid(), owner.gid());
    }
    Ok(Built {
        server,
        path,
        owner,
        lease_file,
    })
}

/// Descriptors a mount needs besides one `/dev/fuse` descriptor per thread (fuser's
/// `clone_fd`) and its ring's: the source's files, logs, sockets and the control files.
pub(super) const FD_SLACK: u64 = 64;

/// The ring of FUSE over io_uring, prepared before the connection exists (its entries are
/// made before INIT can accept the ring: all or none), or `None` for `/dev/fuse` alone.
/// Descriptors are counted, not run out of: fuser's threads end silently when they cannot
/// clone `/dev/fuse`, and a ring short of entries would hold its queue's requests.
///
/// Errors: too few descriptors for `--threads`; `--transport uring` where the ring cannot be
/// had (with `auto`, that is a warning and `/dev/fuse` serves).
///
/// A kept mount (`keeping`) is served over `/dev/fuse`: the requests a dead daemon held in its
/// ring entries cannot be resent (`crate::fuse::takeover`). `--transport uring` with
/// `--keeper` is refused.
pub(super) fn transport(
    built: &Built,
    opts: &DaemonOptions,
    keeping: bool,
) -> Result<Option<crate::fuse::uring::Prepared>> {
    let free = super::free_descriptors();
    let threads = opts.threads.max(1) as u64;
    if free < threads + FD_SLACK {
        anyhow::bail!(
            "too few file descriptors: {free} free under RLIMIT_NOFILE, and --threads {threads} \
             needs {} (one /dev/fuse descriptor per thread, {FD_SLACK} for the source and logs); \
             raise the limit (ulimit -n) or lower --threads",
            threads + FD_SLACK
        );
    }
    let entries = crate::fuse::uring::entries(opts.threads) as u64;
    if keeping {
        if opts.transport == Transport::Uring {
            return Err(refuse(
                ExitKind::Usage,
                "--transport uring cannot be kept (the requests a dead daemon holds in its \
                 ring entries are never resent): give --keeper=false, or --transport classic",
            ));
        }
        if opts.transport == Transport::Auto {
            log::info!("a kept mount is served through /dev/fuse (--keeper=false for io_uring)");
        }
        return Ok(None);
    }
    if !super::wants_uring(opts)? {
        return Ok(None);
    }
    if free < threads + FD_SLACK + entries {
        let e = format!(
            "{free} file descriptors free under RLIMIT_NOFILE; the ring needs {entries} more \
             than /dev/fuse's {}",
            threads + FD_SLACK
        );
        if opts.transport == Transport::Uring {
            return Err(refuse(
                ExitKind::Unavailable,
                format!("--transport uring: {e}"),
            ));
        }
        log::warn!("FUSE over io_uring not used ({e}); requests go through /dev/fuse");
        return Ok(None);
    }
    let (uid, gid) = (built.owner.uid(), built.owner.gid());
    let handler = crate::fuse::uring::Handler::new(built.server.clone(), uid, gid);
    match crate::fuse::uring::Prepared::new(opts.threads, handler) {
        Ok(p) => Ok(Some(p)),
        Err(e) if opts.transport == Transport::Uring => Err(refuse(
            ExitKind::Unavailable,
            format!("--transport uring: {e}"),
        )),
        Err(e) => {
            log::warn!("FUSE over io_uring not used ({e}); requests go through /dev/fuse");
            Ok(None)
        }
    }
}

/// The kernel's connection, served.
pub(super) struct Connected {
    /// fuser's session on its own threads (its guard tells when the kernel let go).
    pub bg: fuser::BackgroundSession,
    /// The descriptor of a handed-over connection (`/dev/fd/N`): not ours to unmount.
    pub handed: Option<RawFd>,
    /// For a first daemon that starts a keeper: what the keeper is given.
    pub to_keep: Option<ToKeep>,
}

/// What a first daemon hands its keeper ([`super::keeper`]).
pub(super) struct ToKeep {
    /// The connection's device (the one the session was opened on, never a clone).
    pub dev: OwnedFd,
    /// What the kernel offered at INIT.
    pub offer: crate::fuse::takeover::InitOffer,
    /// Whether the daemons read this device and a dead one's requests are resent.
    pub resend: bool,
}

/// Opens the FUSE session at `mnt` (mounting it, or taking the handed-over descriptor), starts
/// fuser's threads and the ring, and wires the filesystem to the kernel: push-ahead stores,
/// inode invalidations, a directory's changes, the bdi's read-ahead.
///
/// Errors: the session cannot open; a ring the kernel accepted cannot register in full (the
/// mount is taken down: it would serve nothing).
///
/// `keeper` is how this daemon stands to a keeper: started by one (`Kept`: the connection is
/// taken over), about to start one (`First`: the INIT offer is recorded and the device kept
/// for it), or none.
pub(super) fn connect(
    built: &Built,
    ring: Option<crate::fuse::uring::Prepared>,
    mnt: &Path,
    opts: &DaemonOptions,
    keeper: Keeper,
) -> Result<Connected> {
    let server = &built.server;
    let (uid, gid) = (built.owner.uid(), built.owner.gid());
    let mut fs = LooseFs::new(server.clone(), uid, gid).with_uring(ring.is_some());
    let offer = Arc::new(std::sync::OnceLock::new());
    let (kept, first) = match keeper {
        Keeper::Kept(k) => (Some(k.conn), false),
        Keeper::First => (None, true),
        Keeper::None => (None, false),
    };
    if first {
        fs = fs.recording_offer(offer.clone());
    }
    let was_kept = kept.is_some();
    let handed = super::handover::handed_fd(mnt);
    let shared = first && opts.resend;
    let session = open_session(fs, mnt, &fs_name(&built.path), opts, handed, kept, shared)?;
    let to_keep = match (first, offer.get()) {
        (true, Some(&offer)) => Some(keep_device(&session, offer, opts.resend)?),
        _ => None,
    };
    let dev = std::os::fd::AsFd::as_fd(&session).try_clone_to_owned()?;
    // Push-ahead stores go through loosefs's own notify (fuser's reports ENOENT as success).
    let push_dev = dev.try_clone()?;
    let bg = session.spawn()?;
    if let Some(ring) = ring {
        start_ring(ring, dev, mnt, opts, server, handed)?;
    }
    let notifier = bg.notifier();
    server.start_push(Box::new(move |ino, data| {
        crate::fuse::notify::store(&push_dev, ino, 0, data)
    }));
    server.set_invalidate(Box::new(move |ino| {
        let _ = notifier.inval_inode(fuser::INodeNo(ino), 0, 0);
    }));
    super::watch_changes(server, &bg, &built.path);
    // A kept mount's read-ahead was set by its first daemon (and a stat of the mountpoint
    // from here would wait for this very daemon).
    if opts.read_ahead_kb > 0
        && handed.is_none()
        && !was_kept
        && let Err(e) = set_read_ahead(mnt, opts.read_ahead_kb)
    {
        log::warn!("cannot set read_ahead_kb for {}: {e}", mnt.display());
    }
    Ok(Connected {
        bg,
        handed,
        to_keep,
    })
}

/// How a daemon stands to a keeper ([`connect`]).
pub(super) enum Keeper {
    /// Started by a keeper, with the connection it holds.
    Kept(super::keeper::Kept),
    /// The first daemon of a kept mount: it starts the keeper once connected.
    First,
    /// No keeper: the mount ends with this daemon.
    None,
}

/// The device a first daemon's keeper holds: a duplicate of the session's. With resend the
/// session's threads read that device too (their unanswered requests outlive them);
/// without, the session's descriptor is swapped for a clone of its own (its unanswered
/// requests end with it, and the keeper's device has none).
fn keep_device(
    session: &fuser::Session<LooseFs>,
    offer: crate::fuse::takeover::InitOffer,
    want_resend: bool,
) -> Result<ToKeep> {
    use std::os::fd::{AsFd, AsRawFd};
    let resend = want_resend && offer.has_resend();
    if want_resend && !resend {
        log::warn!(
            "this kernel cannot resend a dead daemon's requests (FUSE_NOTIFY_RESEND, Linux              6.9+): the reads in flight when a daemon dies will fail"
        );
    }
    let dev = session.as_fd().try_clone_to_owned()?;
    if !resend {
        let own = crate::fuse::takeover::clone_device(&dev)?;
        crate::fuse::takeover::swap_in(session.as_fd().as_raw_fd(), own)
            .context("cannot swap in a cloned device")?;
    }
    let offer = if resend {
        offer
    } else {
        offer.without_resend()
    };
    Ok(ToKeep { dev, offer, resend })
}

/// Registers the prepared ring's entries on the connection `dev`.
fn start_ring(
    ring: crate::fuse::uring::Prepared,
    dev: OwnedFd,
    mnt: &Path,
    opts: &DaemonOptions,
    server: &crate::fs::Fs,
    handed: Option<RawFd>,
) -> Result<()> {
    use crate::fuse::uring::StartError;
    let t = &server.stats.transport;
    match crate::fuse::uring::start(ring, dev, mnt, t) {
        Ok(()) => log::info!(
            "requests over io_uring: {} queues, {} entries",
            t.queues.load(std::sync::atomic::Ordering::Relaxed),
            t.threads.load(std::sync::atomic::Ordering::Relaxed)
        ),
        Err(StartError::NotOffered(e)) if opts.transport != Transport::Uring => {
            log::warn!("FUSE over io_uring not used ({e}); requests go through /dev/fuse")
        }
        // The kernel holds every request until each queue has an entry: a ring accepted
        // and not registered in full serves nothing, so the mount goes.
        Err(e) => {
            if handed.is_none() {
                let _ = super::unmount(mnt, true);
            }
            anyhow::bail!(
                "FUSE over io_uring: {e}; nothing is mounted at {} (--transport classic \
                 serves through /dev/fuse)",
                mnt.display()
            );
        }
    }
    Ok(())
}

/// Starts the metrics endpoint bound earlier (`--metrics-addr`), if any.
pub(super) fn serve_metrics(
    metrics: Option<metrics_endpoint::Endpoint>,
    built: &Built,
    mnt: &Path,
) -> Result<Option<String>> {
    let Some(m) = metrics else {
        return Ok(None);
    };
    let url = format!("http://{}/metrics", m.addr());
    m.serve(built.server.clone(), mnt.display().to_string())?;
    log::info!("metrics of {} at {url}", mnt.display());
    Ok(Some(url))
}

/// Tells whoever waits that the mount answers: `ready\n` on `ready` (the `loosefs mount`
/// that started this daemon; the daemon's stderr then goes to its log), and systemd's
/// `READY=1` under a `Type=notify` unit (`NOTIFY_SOCKET`).
///
/// Returns false when nobody waits any more: the `loosefs mount` that started this daemon
/// ended (Ctrl-C while the source was indexed), so `ready` found no reader.
///
/// Errors: the log cannot be opened (an explicit `--log`).
pub(super) fn announce(
    ready: Option<OwnedFd>,
    built: &Built,
    mnt: &Path,
    opts: &DaemonOptions,
    metrics: Option<&str>,
    log: &Path,
) -> Result<bool> {
    if let Some(fd) = ready {
        let mut f = std::fs::File::from(fd);
        let line = match metrics {
            Some(url) => format!("ready {url}\n"),
            None => "ready\n".to_string(),
        };
        let waited = f.write_all(line.as_bytes()).is_ok();
        drop(f);
        if !opts.logs_to_stderr() {
            super::redirect_stderr(log, opts.log.is_some())?;
        }
        if !waited {
            return Ok(false);
        }
    } else {
        // In the foreground: the same line `loosefs mount` prints for its daemon.
        let metrics = metrics
            .map(|u| format!(", metrics {u}"))
            .unwrap_or_default();
        opts.progress.note(&format!(
            "mounted {} at {} (pid {}{metrics})",
            built.path.display(),
            mnt.display(),
            std::process::id()
        ));
    }
    let status = format!("serving {} at {}", built.path.display(), mnt.display());
    log::info!("{status}");
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(
            false,
            &[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status(&status),
            ],
        )
    {
        log::warn!("cannot tell systemd the mount is ready (NOTIFY_SOCKET): {e}");
    }
    Ok(true)
}

/// After the signal loop: tells systemd, waits (at most 10 s) for the kernel to end the
/// session of a mount of ours, closes the filesystem, and removes a default log this mount
/// left empty (temporary mountpoints, the Python API's, would otherwise leave one each).
pub(super) fn finish(c: Connected, built: &Built, mnt: &Path, opts: &DaemonOptions, log: &Path) {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    }
    // A handed-over connection is not ours to unmount: the session ends with the process.
    let t0 = std::time::Instant::now();
    while c.handed.is_none() && !c.bg.guard.is_finished() && t0.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    log::info!("unmounted {}", mnt.display());
    built.server.close();
    if opts.log.is_none() && std::fs::metadata(log).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = std::fs::remove_file(log);
    }
    // The session is over: the kernel has let go of this mount. Dropping `bg` would unmount
    // `mnt` by path, which by now may be a new mount of the same directory; so it is not
    // dropped, and its device fd closes when the process exits.
    std::mem::forget(c.bg);
}
