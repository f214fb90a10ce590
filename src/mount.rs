//! Mount lifecycle: the background daemon, readiness, signals; the mountpoint's checks
//! (`mount/mountpoint.rs`) and unmounting (`mount/unmount.rs`) beside it.
//!
//! `loosefs mount` without `--foreground` re-executes itself with `--foreground` in a new
//! process group and waits on a pipe: the daemon writes `ready` once the kernel has completed
//! the FUSE handshake, so the command returns only when the mount answers, like `mount(8)`.
//! Only the daemon opens the source: its progress and startup errors reach the caller's
//! stderr (its own until `ready`) and exit code. A daemon whose `loosefs mount` ended before
//! `ready` (Ctrl-C while a source was indexed) finds nobody reading the pipe, and unmounts.
//! The daemon unmounts on SIGINT/SIGTERM/SIGHUP and exits when the filesystem is unmounted
//! from outside (`umount`, `fusermount3 -u`, `loosefs umount`).
//!
//! A mountpoint `/dev/fd/N` is a FUSE connection mounted by someone else and handed over as
//! descriptor N ([`handover`]): the daemon serves it and needs no privilege.

use crate::mount_table::mount_device;
pub use crate::mount_table::{mount_fstype, why_no_answer};
use crate::open::Dataset;
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

pub mod compose;
mod daemon;
mod daemon_options;
pub mod env_file;
pub use daemon_options::{DaemonOptions, Transport};
pub mod handover;
pub mod keeper;
mod log_file;
pub use log_file::LogSink;
mod mountpoint;
use mountpoint::{check_mountpoint, mountpoint_or_fd};
mod unmount;
pub(crate) use session::mount_fuse;
pub use unmount::{connection_dir, unmount, unmount_and_wait};
pub(crate) mod metrics_endpoint;
mod session;
use session::{Lease, serve_until_signal};

/// The `loosefs mount …` command line when it is not the process's own (the mount(8) helper
/// translates its `-o` options into one).
static COMMAND_LINE: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// Records `args` (`loosefs mount PACK DIR …`) as the command line the daemon is started with.
pub fn set_command_line(args: Vec<std::ffi::OsString>) {
    let _ = COMMAND_LINE.set(args);
}

/// The command line a daemon or keeper started from this one is given: the recorded one
/// ([`set_command_line`]: the helper's translation, or a URL's SAS taken out), else this
/// process's own.
pub(crate) fn command_line() -> Vec<std::ffi::OsString> {
    COMMAND_LINE
        .get()
        .cloned()
        .unwrap_or_else(|| std::env::args_os().collect())
}

/// Environment variable carrying the readiness pipe's fd from the launcher to the daemon.
const READY_FD_ENV: &str = "LOOSEFS_READY_FD";

/// `loosefs mount`: checks the mountpoint and launches the daemon, waiting until the mount is
/// ready; as the daemon (`--foreground`), opens the source, checks the views and the pin
/// against it, and serves.
pub fn mount(pack_path: &Path, mnt: &Path, opts: &DaemonOptions) -> Result<()> {
    if !opts.foreground {
        // Only the daemon opens the source, showing its progress and any error on this
        // terminal (its stderr until ready): opening it here too would walk a directory and
        // read its JPEG headers twice, or double a URL's requests.
        mountpoint_or_fd(mnt, opts.allow_non_empty)?;
        return launch(pack_path, mnt, opts);
    }
    // A daemon started by the mount's keeper takes over its connection ([`keeper`]).
    let kept = keeper::Kept::from_env()?;
    let first_of_handed = keeper::first_of_handed();
    // A kept connection handed over by someone other than its keeper (a restarted CSI
    // mounter): this process becomes its keeper again.
    let kept = match kept {
        Some(k) if opts.keeper == Some(true) && !keeper::under_a_keeper() => {
            let code = keeper::keep_taken_over(k, mnt)?;
            if code != 0 {
                return Err(DaemonFailed(code).into());
            }
            return Ok(());
        }
        k => k,
    };
    // A handed-over connection to keep: this process becomes its keeper, its child the daemon.
    if let (None, None, Some(true), Some(fd)) = (
        &kept,
        &first_of_handed,
        opts.keeper,
        handover::handed_fd(mnt),
    ) {
        let code = keeper::keep_handed(fd, mnt)?;
        if code != 0 {
            return Err(DaemonFailed(code).into());
        }
        return Ok(());
    }
    ready_fd_not_inherited();
    let pack = Dataset::open(pack_path, &opts.open, opts.progress)
        .with_context(|| format!("cannot mount {}", pack_path.display()))?;
    // A view the source cannot have is refused here, before any daemon starts.
    pack.views(opts.views)?;
    let mnt_abs = match &kept {
        // Mounted, and not to be asked anything: this daemon is the one to answer.
        Some(k) => {
            crate::mount_table::set_resolved_mountpoint(k.mountpoint.clone());
            k.mountpoint.clone()
        }
        None => mountpoint_or_fd(mnt, opts.allow_non_empty)?,
    };
    if let Some(bytes) = opts.readahead.pin {
        // An option asking for more memory than this process may lock: bad usage.
        crate::memory::check_pin_budget(bytes.min(pack.stored_bytes()))
            .with_context(|| format!("cannot pin {}", pack_path.display()))
            .map_err(|e| crate::exit_code::with_kind(e, crate::exit_code::ExitKind::Usage))?;
    }
    let ready = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    // SAFETY: the launcher passed this fd number for the write end of a pipe it created for
    // us, and nothing else in this process owns it.
    let ready = ready.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    serve(pack, &mnt_abs, opts, ready, kept, first_of_handed)
}

/// Marks the readiness pipe the launcher handed over close-on-exec, before the daemon runs
/// anything (a `credential_process` that never exits would otherwise hold the pipe open, and
/// the launcher waiting for its end, after the daemon has reported and exited).
fn ready_fd_not_inherited() {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    handover::set_cloexec(fd);
}

fn launch(pack_path: &Path, mnt: &Path, opts: &DaemonOptions) -> Result<()> {
    // Called from `loosefs mount ...`: re-run it with --foreground as the daemon.
    let (rx, tx) = nix::unistd::pipe().context("cannot create a pipe")?;
    nix::fcntl::fcntl(
        &rx,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let exe = std::env::current_exe().context("cannot find the loosefs executable")?;
    let mut cmd = std::process::Command::new(exe);
    // The daemon is this same command line, in the foreground: every option reaches it.
    let args = command_line();
    // `--foreground` right after `mount` (never after a `--`), and the caller's own
    // `--foreground=false` (how the Python API overrides an inherited LOOSEFS_FOREGROUND) left
    // out: clap takes an option once.
    let mut rest = args.iter().skip(1);
    cmd.args(rest.next()).arg("--foreground");
    // A mount in the background is kept across daemon deaths unless told otherwise; an
    // explicit `--transport uring` is not (a ring's requests cannot be resent).
    if opts.keeper.is_none() && opts.transport != Transport::Uring {
        cmd.arg("--keeper");
    }
    let mut options = true;
    for a in rest {
        options &= a != "--";
        let own = a == "--foreground"
            || a == "-f"
            || a.to_str().is_some_and(|s| s.starts_with("--foreground="));
        if !(options && own) {
            cmd.arg(a);
        }
    }
    cmd.env(READY_FD_ENV, tx.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0);
    use std::os::unix::process::CommandExt;
    let mut child = cmd.spawn().context("cannot start the loosefs daemon")?;
    drop(tx);
    let mut msg = String::new();
    let _ = std::fs::File::from(rx).read_to_string(&mut msg);
    if let Some(rest) = msg.trim().strip_prefix("ready") {
        let log = match opts.logs_to_stderr() {
            true => "on stderr".to_string(),
            false => opts.log_path(mnt).display().to_string(),
        };
        let metrics = match rest.trim() {
            "" => String::new(),
            url => format!(", metrics {url}"),
        };
        // A `{"note": …}` line under --progress-lines, as every other message then.
        opts.progress.note(&format!(
            "mounted {} at {} (daemon pid {}, log {log}{metrics})",
            pack_path.display(),
            mnt.display(),
            child.id()
        ));
        if opts.wait && (opts.readahead.pin.is_some() || opts.warm) {
            crate::client::wait_pin_and_warm(
                mnt,
                opts.readahead.pin.is_some(),
                opts.warm,
                opts.progress,
            )?;
        }
        return Ok(());
    }
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    match status.code() {
        // The daemon said why on this stderr (`loosefs: error: …`): nothing to add.
        Some(code) => Err(DaemonFailed(code).into()),
        None => bail!(
            "the loosefs daemon was killed (signal {}) before the mount was ready; its log: {}",
            status.signal().unwrap_or(0),
            opts.log_path(mnt).display()
        ),
    }
}

/// The background daemon ended before the mount was ready with this exit code, after printing
/// why on the stderr it shares with `loosefs mount`: the command exits with that code and
/// prints nothing more.
#[derive(Debug)]
pub struct DaemonFailed(pub i32);

impl std::fmt::Display for DaemonFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the loosefs daemon failed to mount (exit code {})",
            self.0
        )
    }
}

impl std::error::Error for DaemonFailed {}

/// A directory mount shows every file as owned by the tree's owner (`root`'s `meta`), whose
/// own mode bits then apply: with `--allow-other` that would let the tree's owner read through
/// the mount a file whose real owner or group denies them. Such a tree is refused, naming the
/// first file or directory owned by someone else (symbolic links and special files are not
/// served, so not checked).
///
/// Errors: an entry owned by another user or group; the tree cannot be walked.
fn same_owner_throughout(root: &Path, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (uid, gid) = (meta.uid(), meta.gid());
    for e in walkdir::WalkDir::new(root).follow_links(false) {
        let e = e.with_context(|| format!("cannot walk {}", root.display()))?;
        let t = e.file_type();
        if !(t.is_file() || t.is_dir()) {
            continue;
        }
        let m = e
            .metadata()
            .with_context(|| format!("cannot stat {}", e.path().display()))?;
        if (m.uid(), m.gid()) != (uid, gid) {
            anyhow::bail!(
                "{}: owned by {}:{}, not by the tree's owner {uid}:{gid}. A directory mount \
                 shows every file as the tree owner's, so with --allow-other that user could \
                 read it through the mount; mount without --allow-other, or give every file the \
                 tree's owner and group",
                e.path().display(),
                m.uid(),
                m.gid()
            );
        }
    }
    Ok(())
}

/// Serves the pack until unmounted or signalled, in the steps of [`daemon`]. `ready` (if
/// any) receives `ready\n` once the mount answers.
fn serve(
    pack: Dataset,
    mnt: &Path,
    opts: &DaemonOptions,
    ready: Option<OwnedFd>,
    kept: Option<keeper::Kept>,
    first_of_handed: Option<OwnedFd>,
) -> Result<()> {
    daemon::tune_allocator(opts.views);
    // The log's path resolves the mountpoint: done once, before it is mounted. Resolving it
    // later is a request to this very mount, which waits forever once the session's threads
    // are stopped (SIGSTOP) or gone (at the end).
    let log = opts.log_path(mnt);
    let mut built = daemon::build(pack, mnt, opts)?;
    let metrics = opts
        .metrics_addr
        .map(metrics_endpoint::Endpoint::bind)
        .transpose()?;
    // Handlers first: a signal from the moment the mount exists (a reader may see it before
    // the ring is up) unmounts it instead of killing the daemon.
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGIO,
    ])?;
    let kept_log = kept.as_ref().and_then(|k| k.log.clone());
    let keeper = match kept {
        Some(k) => {
            log::info!(
                "taking over {} from the daemon before (its end: {})",
                mnt.display(),
                std::env::var("LOOSEFS_KEEPER_LAST").unwrap_or_default()
            );
            daemon::Keeper::Kept(k)
        }
        None if opts.keeper == Some(true) => daemon::Keeper::First,
        None => daemon::Keeper::None,
    };
    let keeping = !matches!(keeper, daemon::Keeper::None);
    let catalog = keeping.then(|| crate::catalog::fingerprint(&**built.server.catalog()));
    if let (daemon::Keeper::Kept(k), Some(now)) = (&keeper, catalog)
        && k.catalog != now
    {
        let e = format!(
            "cannot take over {}: the source's files are not the ones the mount was made with \
             (catalog {now:08x}, was {:08x}: a directory changed, or a remote object was \
             replaced, since the mount); serving them under the old inode numbers could give \
             wrong bytes, so the mount ends. Mount it again",
            mnt.display(),
            k.catalog
        );
        log::error!("{e}");
        crate::eprintln_lossy!("loosefs: {e}");
        return Err(DaemonFailed(keeper::REFUSED).into());
    }
    let ring = daemon::transport(&built, opts, keeping)?;
    let mut connected = daemon::connect(&built, ring, mnt, opts, keeper)?;
    if let Some(k) = keeper::report() {
        let _ = crate::report::KEEPER.set(k);
    }
    let to_keep = connected.to_keep.take();
    if let (Some(tk), Some(to)) = (&to_keep, first_of_handed) {
        // The keeper is this daemon's parent and holds the connection already.
        keeper::tell_handed_keeper(to, tk.offer, tk.resend, catalog.unwrap_or(0));
        let _ = crate::report::KEEPER.set(crate::report::KeeperReport {
            pid: nix::unistd::getppid().as_raw() as u32,
            ..Default::default()
        });
    } else if let Some(tk) = to_keep {
        // The keeper's log is the daemon's, when the daemon logs to a file.
        let log = (ready.is_some() && !opts.logs_to_stderr()).then(|| log.clone());
        let exe = std::env::current_exe().context("cannot find the loosefs executable")?;
        let mut command = vec![exe.into_os_string()];
        command.extend(std::env::args_os().skip(1));
        let args = keeper::KeepArgs {
            fd: keeper::KEPT_FD,
            offer: tk.offer,
            resend: tk.resend,
            daemon: Some(std::process::id()),
            mountpoint: mnt.to_path_buf(),
            log,
            catalog: catalog.unwrap_or(0),
            command,
        };
        let pid = keeper::spawn(&tk.dev, &args)?;
        log::info!("keeper of {}: pid {pid}", mnt.display());
        let _ = crate::report::KEEPER.set(crate::report::KeeperReport {
            pid,
            ..Default::default()
        });
    }
    if let Some(log) = kept_log {
        redirect_stderr(&log, false)?;
    }
    let lease = (built.lease_file.take()).and_then(|f| Lease::take(&built.path, f));
    let metrics = daemon::serve_metrics(metrics, &built, mnt)?;
    if !daemon::announce(ready, &built, mnt, opts, metrics.as_deref(), &log)? {
        // The `loosefs mount` that started this daemon is gone (interrupted while the source
        // was opened or indexed): nobody asked for this mount any more.
        log::warn!(
            "the loosefs mount that started this daemon ended before {} was ready; unmounting it",
            mnt.display()
        );
        if connected.handed.is_none()
            && let Err(e) = unmount(mnt, true)
        {
            log::warn!("{e:#}");
        }
        daemon::finish(connected, &built, mnt, opts, &log);
        bail!("interrupted before the mount was ready");
    }
    serve_until_signal(
        mnt,
        signals,
        &connected.bg,
        &built.server,
        lease.as_ref(),
        &built.path,
    );
    daemon::finish(connected, &built, mnt, opts, &log);
    Ok(())
}

/// Starts watching a loose directory for changes (nothing for other datasets): each change
/// drops the kernel's entry of the name, its directory's listing and the stale inodes' pages.
fn watch_changes(server: &crate::fs::Fs, bg: &fuser::BackgroundSession, dir: &Path) {
    if let Some(changes) = server.changes() {
        let kernel = bg.notifier();
        let forget = Box::new(move |n: &crate::fs::changes::Noted| {
            let name = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n.name);
            let _ = kernel.inval_entry(fuser::INodeNo(n.dir), name);
            // The directory's cached listing (a name added leaves no entry to invalidate).
            let _ = kernel.inval_inode(fuser::INodeNo(n.dir), 0, 0);
            for &ino in &n.was {
                let _ = kernel.inval_inode(fuser::INodeNo(ino), 0, 0);
            }
        });
        if let Err(e) = crate::fs::watch::start(changes.clone(), forget) {
            log::warn!(
                "cannot watch {} for changes ({e}): they show at the next mount",
                dir.display()
            );
        }
    }
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (as most daemons do) and
/// returns how many more descriptors it may open.
fn free_descriptors() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (mut soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        soft = hard;
    }
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    soft.saturating_sub(open)
}

/// Whether to ask for FUSE over io_uring (`--transport`); `uring` where the kernel cannot
/// give it is an error naming why.
fn wants_uring(opts: &DaemonOptions) -> Result<bool> {
    let passthrough = opts.passthrough;
    match opts.transport {
        Transport::Classic => Ok(false),
        Transport::Uring if passthrough => Err(crate::exit_code::refuse(
            crate::exit_code::ExitKind::Usage,
            "--transport uring: passthrough opens need --transport classic",
        )),
        Transport::Uring => crate::fuse::uring::enable().map(|()| true).map_err(|e| {
            crate::exit_code::refuse(
                crate::exit_code::ExitKind::Unavailable,
                format!("--transport uring: {e}"),
            )
        }),
        Transport::Auto if passthrough => Ok(false),
        Transport::Auto => Ok(crate::fuse::uring::enable()
            .inspect_err(|e| log::info!("FUSE over io_uring not used: {e}"))
            .is_ok()),
    }
}

pub use crate::mount_table::FS_TYPE;

/// Points the daemon's stderr (its log) at `log`, appending, and log records into it rotated
/// by size while it runs ([`log_file`]: at most three files of about 8 MiB). A log already past
/// that size when the mount starts is rotated first. A missing parent directory is made with
/// mode 0700, a new log file 0600 (messages name the dataset's files). A default log that
/// cannot be opened is given up (the daemon logs to `/dev/null`); with `explicit` (`--log` was
/// given) that is an error.
fn redirect_stderr(log: &Path, explicit: bool) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
    }
    // Opened under its directory's descriptor, never through a link (log_file.rs says why).
    let opened =
        log_file::LogPlace::new(log).and_then(|place| place.open_appending().map(|f| (place, f)));
    let (place, target) = match opened {
        Ok((place, f)) => (Some(place), f),
        Err(e) if explicit => {
            return Err(e).with_context(|| format!("cannot open log {}", log.display()));
        }
        // The default place cannot be written (a read-only home): no log, as before.
        Err(_) => (
            None,
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .context("cannot open /dev/null")?,
        ),
    };
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.flush();
    nix::unistd::dup2_stderr(&target)?;
    drop(stderr);
    // A log file (not /dev/null or a terminal) is rotated by size from now on.
    if let Some(place) = place.filter(|_| target.metadata().is_ok_and(|m| m.is_file())) {
        log_file::rotate_into(place, target);
    }
    Ok(())
}
