//! The keeper: a small process that holds a mount's FUSE connection apart from the daemon that
//! serves it, so the mount outlives the daemon (a crash, the OOM killer, `loosefs restart`).
//!
//! - **Start.** The first daemon mounts and answers FUSE_INIT as always, records what the
//!   kernel offered ([`InitOffer`]), then starts `loosefs keep` ([`spawn`]) with a duplicate of
//!   the connection's descriptor as its fd 3, and only then says `ready`.
//! - **A death.** When the daemon dies while the connection is alive, the keeper sends
//!   `FUSE_NOTIFY_RESEND` (the requests the dead daemon had read go back to the queue) and
//!   starts the same command again with the descriptor as fd 3 and the offer in its
//!   environment ([`Kept`]): the new daemon builds its session on a replayed INIT
//!   (`crate::fuse::takeover`), never a second one on the connection, reopens the caches of the
//!   old one (their entries are checked, so a half-written one is dropped) and serves.
//! - **Requests in flight.** With resend, every daemon reads from the one device the keeper
//!   holds, so its unanswered requests survive it. Without (a kernel before 6.9, or
//!   `--resend=false`), each daemon reads from its own clone of the device: its unanswered
//!   requests end with it (ECONNABORTED, EIO to most callers), and nothing else fails.
//! - **`loosefs restart`** ([`restart`]) sends SIGUSR1: the keeper starts a new daemon from the
//!   same path (an upgraded binary, if one was put there), waits for its `ready`, then kills
//!   the old one and resends what it held. Readers see a pause, no error.
//! - **Limits.** [`DEATHS`] deaths within [`WINDOW`] end the mount: the keeper aborts the
//!   connection (readers get ENOTCONN, not a hang), takes the mount down if it is still this
//!   one, logs why and exits 1. SIGTERM, SIGINT or SIGHUP are passed to the daemon (which
//!   unmounts); the keeper exits when the connection ends.
//!
//! The keeper has no data path: it reads no request and touches no cache. It allocates only
//! to start a daemon.

mod kept;

use crate::fuse::takeover::{self, InitOffer};
use anyhow::{Context, Result, bail};
use kept::{
    FIRST_OF_ENV, KEEPER_PID_ENV, KEPT_CATALOG_ENV, KEPT_FD_ENV, KEPT_INIT_ENV, KEPT_LOG_ENV,
    KEPT_MOUNTPOINT_ENV, KEPT_RESEND_ENV, LAST_ENV, RESTARTS_ENV, info_fd,
};
pub use kept::{INFO_FD_ENV, report, taken_over_env};
pub(crate) use kept::{Kept, first_of_handed, tell_handed_keeper, under_a_keeper};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The descriptor number the connection has in the keeper and in every daemon it starts.
pub const KEPT_FD: RawFd = 3;
/// The exit code of a daemon that refuses to take over (its catalog is not the first one's):
/// the keeper ends the mount at once instead of trying again.
pub const REFUSED: i32 = 3;
/// Deaths of a mount's daemon within [`WINDOW`] after which the keeper ends the mount.
pub const DEATHS: usize = 5;
/// See [`DEATHS`].
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long a daemon started by `loosefs restart` has to say `ready`.
pub const RESTART_READY: Duration = Duration::from_secs(300);

/// What `loosefs keep` is told by the daemon that starts it.
#[derive(Debug, Clone)]
pub struct KeepArgs {
    /// The keeper's descriptor of the connection (3 for `loosefs keep`; the handed number
    /// for a handed-over connection's keeper, [`keep_handed`]).
    pub fd: RawFd,
    /// What the kernel offered at INIT.
    pub offer: InitOffer,
    /// Whether daemons read the keeper's device and dead ones' requests are resent.
    pub resend: bool,
    /// The first daemon's pid (watched, not started); `None`: the connection was taken over
    /// from a mounter that died (the CSI node plugin held it), and the keeper resends what
    /// was in flight and starts the first daemon itself.
    pub daemon: Option<u32>,
    /// The mountpoint (`/dev/fd/N` for a handed-over connection: not the keeper's to
    /// unmount).
    pub mountpoint: PathBuf,
    /// The log the keeper appends to (`None`: its stderr).
    pub log: Option<PathBuf>,
    /// The first daemon's catalog [`fingerprint`]: a new daemon whose catalog differs
    /// refuses to serve (its inode numbers would name other files).
    pub catalog: u32,
    /// The daemon's command line, run again for each new daemon.
    pub command: Vec<OsString>,
}

/// Starts `loosefs keep` for the connection `dev` served by this process (the first daemon):
/// the keeper gets a duplicate of `dev` as its fd 3. Returns its pid.
///
/// Errors: the executable cannot be found or started.
pub(super) fn spawn(dev: &OwnedFd, args: &KeepArgs) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find the loosefs executable")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("keep")
        .arg(format!("--offer={}", args.offer))
        .arg(format!("--resend={}", args.resend))
        .arg(format!("--daemon={}", args.daemon.unwrap_or(0)))
        .arg(format!("--catalog={:08x}", args.catalog))
        .arg("--mountpoint")
        .arg(&args.mountpoint);
    if let Some(log) = &args.log {
        cmd.arg("--log").arg(log);
    }
    cmd.arg("--").args(&args.command);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    super::handover::place_fd(&mut cmd, dev.as_raw_fd(), KEPT_FD);
    let child = cmd.spawn().context("cannot start the mount's keeper")?;
    Ok(child.id())
}

/// What the keeper's loop waits for.
enum Event {
    /// A daemon ended; how (an exit code, a signal, or `ended` for the first daemon, not the
    /// keeper's child).
    Died { pid: u32, how: String },
    /// A daemon started for a swap said `ready` (or closed its pipe without: `false`).
    Ready { pid: u32, ok: bool },
    /// A signal to the keeper.
    Signal(i32),
}

/// `loosefs keep` (started by the first daemon, [`spawn`]): keeps the connection on fd 3
/// served until it ends, as the module doc says. Returns the exit code: 0 once the
/// connection ended (unmounted), 1 after giving up.
///
/// Errors: fd 3 is not a `/dev/fuse` descriptor; signals cannot be handled.
pub fn keep(a: KeepArgs) -> Result<i32> {
    if a.command.is_empty() {
        bail!("loosefs keep: give the daemon's command after `--`");
    }
    super::handover::is_fuse_device(a.fd)?;
    if let Some(log) = &a.log {
        super::redirect_stderr(log, false)?;
    }
    // SAFETY: the descriptor was handed to this process to hold; it is never closed before
    // exit (except on giving up, after which it is not used).
    let dev = unsafe { BorrowedFd::borrow_raw(a.fd) };
    let device = super::mount_device(&a.mountpoint);
    let (tx, rx) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
    ])
    .context("cannot handle signals")?;
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for s in signals.forever() {
                if tx.send(Event::Signal(s)).is_err() {
                    break;
                }
            }
        });
    }
    let first = match a.daemon {
        Some(pid) => {
            watch_pid(pid, tx.clone())?;
            pid
        }
        None => {
            resend(&a, dev);
            start(&a, 0, "taken over from a mounter that ended", false, &tx)?
        }
    };
    log::info!(
        "keeper of {} (pid {}): daemon pid {first}; requests in flight at a death are {}",
        a.mountpoint.display(),
        std::process::id(),
        if a.resend {
            "resent"
        } else {
            "failed (no resend)"
        }
    );
    let mut current = first;
    let mut swapping: Option<u32> = None;
    let mut retiring: Option<u32> = None;
    let mut stopping = false;
    let mut restarts = 0u32;
    let mut deaths = [None::<Instant>; DEATHS];
    let mut next_death = 0;
    while let Ok(event) = rx.recv() {
        match event {
            Event::Signal(signal_hook::consts::SIGUSR1) => {
                if stopping || swapping.is_some() {
                    continue;
                }
                restarts += 1;
                match start(&a, restarts, "replaced by loosefs restart", true, &tx) {
                    Ok(pid) => {
                        log::info!("loosefs restart: starting daemon pid {pid} beside {current}");
                        swapping = Some(pid);
                    }
                    Err(e) => log::error!("loosefs restart: {e:#}; daemon {current} serves on"),
                }
            }
            Event::Signal(sig) => {
                log::info!("signal {sig}: passing SIGTERM to daemon {current}");
                stopping = true;
                signal(current, libc::SIGTERM);
            }
            Event::Ready { pid, ok } if Some(pid) == swapping => {
                swapping = None;
                if !ok {
                    log::error!("loosefs restart: daemon {pid} did not start; {current} serves on");
                    signal(pid, libc::SIGKILL);
                    continue;
                }
                log::info!("loosefs restart: daemon {pid} serves; stopping {current}");
                retiring = Some(current);
                signal(current, libc::SIGKILL);
                current = pid;
            }
            Event::Ready { .. } => {}
            Event::Died { pid, how } if Some(pid) == retiring => {
                retiring = None;
                log::info!("the replaced daemon {pid} ended ({how})");
                resend(&a, dev);
            }
            Event::Died { pid, how } if pid != current => {
                log::info!("daemon {pid} ended ({how})");
            }
            Event::Died { pid, how } if how == format!("exit code {REFUSED}") => {
                if stopping || !alive(dev) {
                    return Ok(0);
                }
                log::error!("daemon {pid} refused to take over (its log says why)");
                give_up(
                    &a,
                    device.as_deref(),
                    "a new daemon's catalog differs from the first's",
                );
                return Ok(1);
            }
            Event::Died { pid, how } => {
                if stopping || !alive(dev) {
                    log::info!("daemon {pid} ended ({how}) and the mount with it; keeper exits");
                    return Ok(0);
                }
                let now = Instant::now();
                deaths[next_death % DEATHS] = Some(now);
                next_death += 1;
                let recent = deaths
                    .iter()
                    .flatten()
                    .filter(|t| now.duration_since(**t) < WINDOW)
                    .count();
                log::error!(
                    "daemon {pid} of {} died ({how}); {recent} of {DEATHS} deaths allowed \
                     within {} s",
                    a.mountpoint.display(),
                    WINDOW.as_secs()
                );
                if recent >= DEATHS {
                    give_up(&a, device.as_deref(), &how);
                    return Ok(1);
                }
                resend(&a, dev);
                restarts += 1;
                match start(&a, restarts, &how, false, &tx) {
                    Ok(new) => {
                        log::info!("daemon {new} takes over from {pid}");
                        current = new;
                    }
                    Err(e) => {
                        log::error!("{e:#}");
                        give_up(&a, device.as_deref(), &format!("{e:#}"));
                        return Ok(1);
                    }
                }
            }
        }
    }
    Ok(0)
}

/// `loosefs mount SOURCE /dev/fd/N --foreground --keeper` (a connection handed over by
/// `loosefs fuse-fd` or the CSI node plugin): this process becomes the keeper of descriptor N
/// and starts the first daemon as its child (the same command line), which says the
/// connection's offer, resend and catalog on a pipe once it serves; then [`keep`]. Whoever
/// waits for this process (fuse-fd, the CSI mounter) thus waits for the mount, not for one
/// daemon. Returns the exit code.
///
/// Errors: descriptor N is not a mounted connection; the daemon cannot start.
pub fn keep_handed(fd: RawFd, mnt: &Path) -> Result<i32> {
    super::handover::check_handed(fd)?;
    // Taken before the daemon starts, so that it does not inherit it.
    let info = info_fd();
    let exe = std::env::current_exe().context("cannot find the loosefs executable")?;
    let mut command = vec![exe.into_os_string()];
    command.extend(super::command_line().into_iter().skip(1));
    let (r, w) = nix::unistd::pipe().context("cannot create a pipe")?;
    nix::fcntl::fcntl(
        &r,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env(FIRST_OF_ENV, w.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null());
    let child = cmd.spawn().context("cannot start the daemon")?;
    drop(w);
    // The readiness pipe of a `loosefs mount` in the background went to the daemon, which says
    // `ready` on it; this keeper's copy would keep that command waiting for its end.
    if let Some(fd) = std::env::var(super::READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<RawFd>().ok())
    {
        // SAFETY: the launcher's pipe end, owned by nothing else in this process; closed once.
        unsafe { libc::close(fd) };
        // SAFETY: no other thread of the keeper runs yet.
        unsafe { std::env::remove_var(super::READY_FD_ENV) };
    }
    let mut line = String::new();
    {
        use std::io::Read;
        let _ = std::fs::File::from(r).read_to_string(&mut line);
    }
    let pid = child.id();
    let parsed = (|| {
        let mut it = line.split_whitespace();
        let offer = InitOffer::parse(it.next()?).ok()?;
        let resend = it.next()? == "1";
        let catalog = u32::from_str_radix(it.next()?, 16).ok()?;
        Some((offer, resend, catalog))
    })();
    let Some((offer, resend, catalog)) = parsed else {
        // The daemon failed before serving (it said why on the shared stderr).
        let mut child = child;
        let status = child.wait()?;
        use std::os::unix::process::ExitStatusExt;
        return Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
    };
    // Not waited for by `Child`: [`watch_pid`] reaps it with its status.
    std::mem::forget(child);
    if let Some(to) = info {
        tell_handed_keeper(to, offer, resend, catalog);
    }
    keep(KeepArgs {
        fd,
        offer,
        resend,
        daemon: Some(pid),
        mountpoint: mnt.to_path_buf(),
        log: None,
        catalog,
        command,
    })
}

/// `loosefs mount SOURCE /dev/fd/3 --foreground --keeper` given a kept connection by someone
/// other than a keeper (a restarted CSI mounter, from the node plugin that held it): this
/// process becomes its keeper, resends what the dead daemon held and starts a daemon.
pub(super) fn keep_taken_over(k: Kept, command_mnt: &Path) -> Result<i32> {
    use std::os::fd::IntoRawFd;
    let fd = k.conn.dev.into_raw_fd();
    if fd != KEPT_FD {
        bail!("a kept connection is handed over as descriptor {KEPT_FD}, not {fd}");
    }
    let exe = std::env::current_exe().context("cannot find the loosefs executable")?;
    let mut command = vec![exe.into_os_string()];
    command.extend(super::command_line().into_iter().skip(1));
    keep(KeepArgs {
        fd,
        offer: k.conn.offer,
        resend: k.conn.resend,
        daemon: None,
        mountpoint: command_mnt.to_path_buf(),
        log: None,
        catalog: k.catalog,
        command,
    })
}

/// Sends `sig` to `pid` (gone already: nothing to do).
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid this keeper started or was given; no memory is involved.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Puts the requests the dead daemon read back in the queue, when resend is on.
fn resend(a: &KeepArgs, dev: BorrowedFd) {
    if a.resend
        && let Err(e) = takeover::resend(dev)
    {
        log::error!("FUSE_NOTIFY_RESEND: {e}; the requests the dead daemon held fail");
    }
}

/// Whether the connection on `dev` is alive: poll(2) reports POLLERR once it was aborted or
/// unmounted (the kernel's `fuse_dev_poll`).
pub(crate) fn alive(dev: BorrowedFd) -> bool {
    let mut p = [libc::pollfd {
        fd: dev.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one pollfd, owned here; a zero timeout never blocks.
    let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 0) };
    n >= 0 && p[0].revents & libc::POLLERR == 0
}

/// Starts a daemon: the keeper's command with the connection as fd 3 and the offer in its
/// environment; with `ready`, a pipe on which it says `ready` ([`Event::Ready`]). Its end
/// comes as [`Event::Died`].
fn start(
    a: &KeepArgs,
    restarts: u32,
    last: &str,
    ready: bool,
    tx: &mpsc::Sender<Event>,
) -> Result<u32> {
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env(KEPT_FD_ENV, KEPT_FD.to_string())
        .env(KEPT_INIT_ENV, a.offer.to_string())
        .env(KEPT_RESEND_ENV, if a.resend { "1" } else { "0" })
        .env(KEEPER_PID_ENV, std::process::id().to_string())
        .env(RESTARTS_ENV, restarts.to_string())
        .env(LAST_ENV, last)
        .env(KEPT_MOUNTPOINT_ENV, &a.mountpoint)
        .env(KEPT_CATALOG_ENV, format!("{:08x}", a.catalog))
        .env_remove(super::READY_FD_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    if let Some(log) = &a.log {
        cmd.env(KEPT_LOG_ENV, log);
    }
    super::handover::place_fd(&mut cmd, a.fd, KEPT_FD);
    let pipe = if ready {
        let (rx, w) = nix::unistd::pipe().context("cannot create a pipe")?;
        // The read end stays here (close-on-exec); the write end goes to the daemon.
        nix::fcntl::fcntl(
            &rx,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
        let wfd = w.as_raw_fd();
        cmd.env(super::READY_FD_ENV, wfd.to_string());
        Some((rx, w))
    } else {
        None
    };
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start the daemon {:?}", a.command[0]))?;
    let pid = child.id();
    if let Some((rx, w)) = pipe {
        drop(w);
        let tx = tx.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut msg = String::new();
            let _ = std::fs::File::from(rx).read_to_string(&mut msg);
            let _ = tx.send(Event::Ready {
                pid,
                ok: msg.starts_with("ready"),
            });
        });
    }
    let tx = tx.clone();
    std::thread::spawn(move || {
        let how = match child.wait() {
            Ok(s) => describe(s),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        let _ = tx.send(Event::Died { pid, how });
    });
    Ok(pid)
}

/// "exit code N" or "killed by signal N".
fn describe(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended".into(),
    }
}

/// Sends [`Event::Died`] when process `pid` (not a child of this one) ends, watched through a
/// pidfd.
///
/// Errors: pidfd_open fails (no such process: it died already, which is sent at once).
fn watch_pid(pid: u32, tx: mpsc::Sender<Event>) -> Result<()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let _ = tx.send(Event::Died {
            pid,
            how: "ended before its keeper started".into(),
        });
        return Ok(());
    }
    // SAFETY: pidfd_open returned a new descriptor this process owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) };
    std::thread::spawn(move || {
        let mut p = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one pollfd over a descriptor owned by this thread; it becomes readable
        // when the process ends.
        while unsafe { libc::poll(p.as_mut_ptr(), 1, -1) } < 0 {}
        // A child of this process (a handed-over connection's first daemon) is reaped here,
        // with its status; another process's end is all that can be told.
        let mut status = 0;
        // SAFETY: waitpid on one pid, without blocking; a pid that is not a child gives ECHILD.
        let how = match unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) } {
            p if p == pid as libc::pid_t && libc::WIFEXITED(status) => {
                format!("exit code {}", libc::WEXITSTATUS(status))
            }
            p if p == pid as libc::pid_t && libc::WIFSIGNALED(status) => {
                format!("killed by signal {}", libc::WTERMSIG(status))
            }
            _ => "ended".into(),
        };
        let _ = tx.send(Event::Died { pid, how });
    });
    Ok(())
}

/// The crash loop's end: the connection is aborted (fusectl's `abort`, then this keeper's
/// descriptor closed: every request waiting fails with ENOTCONN), and the mount taken down if
/// it is still this one.
fn give_up(a: &KeepArgs, device: Option<&str>, last: &str) {
    log::error!(
        "the daemon of {} died {DEATHS} times within {} s (last: {last}); aborting the \
         connection: readers get ENOTCONN. Its log above says why; mount it again once fixed",
        a.mountpoint.display(),
        WINDOW.as_secs()
    );
    crate::eprintln_lossy!(
        "loosefs: the daemon of {} died {DEATHS} times within {} s (last: {last}); the mount \
         is aborted",
        a.mountpoint.display(),
        WINDOW.as_secs()
    );
    let ours = device.is_some() && super::mount_device(&a.mountpoint).as_deref() == device;
    if ours && let Some(conn) = super::connection_dir(&a.mountpoint) {
        let _ = std::fs::write(conn.join("abort"), "1");
    }
    // SAFETY: the keeper's descriptor is closed once, here, and never used after.
    unsafe { libc::close(a.fd) };
    if ours && let Err(e) = super::unmount(&a.mountpoint, true) {
        log::warn!("cannot take down {}: {e:#}", a.mountpoint.display());
    }
}

/// `loosefs restart MNT`: swaps in a new daemon, started from the same executable path as the
/// old one (an upgraded binary, if one was installed there), while the mount stays; returns
/// the report of the new daemon once it serves.
///
/// Errors: `mnt` is not a kept loosefs mount (mounted with `--keeper=false` or in the
/// foreground), the keeper cannot be signalled, or no new daemon serves within
/// [`RESTART_READY`] (the old one serves on; the log says why).
pub fn restart(mnt: &Path) -> Result<crate::report::Report> {
    let old: crate::report::Report = crate::client::read_control(mnt, "stats")?;
    let Some(k) = &old.daemon.keeper else {
        bail!(
            "{} has no keeper (mounted in the foreground or with --keeper=false): unmount and \
             mount it again to change its daemon",
            mnt.display()
        );
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(k.pid as i32),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .with_context(|| {
        format!(
            "cannot signal the keeper of {} (pid {})",
            mnt.display(),
            k.pid
        )
    })?;
    let t0 = Instant::now();
    let mut wait = Duration::from_millis(10);
    while t0.elapsed() < RESTART_READY {
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(200));
        if let Ok(r) = crate::client::read_control::<crate::report::Report>(mnt, "stats")
            && r.daemon.pid != old.daemon.pid
        {
            return Ok(r);
        }
    }
    bail!(
        "no new daemon serves {} after {} s; the old one (pid {}) serves on. Its log: {}",
        mnt.display(),
        RESTART_READY.as_secs(),
        old.daemon.pid,
        old.daemon.log
    )
}
