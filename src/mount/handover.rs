//! A FUSE connection handed over as a descriptor (the pattern of mountpoint-s3's CSI driver v2
//! and GKE's gcsfuse sidecar): a privileged side opens `/dev/fuse`, mounts it, and passes the
//! descriptor to an unprivileged daemon, which serves it without any capability.
//!
//! - The daemon side: `loosefs mount SOURCE /dev/fd/N` serves descriptor N ([`handed_fd`],
//!   [`check_handed`]); it mounts nothing, so it unmounts nothing either: on a signal it ends,
//!   the kernel aborts the connection, and the privileged side takes the mount down.
//! - The privileged side: `loosefs fuse-fd MNT -- COMMAND…` ([`fuse_fd`]) mounts `/dev/fuse` at
//!   MNT (type `fuse.loosefs`, the options `loosefs mount` gives), runs COMMAND with the
//!   descriptor as its fd N (default 3), waits for it, and unmounts MNT when it ends (a daemon
//!   that died leaves no stale mount). Unmounting MNT first ends the daemon's session, so the
//!   daemon exits and then the helper.
//! - Across containers: `loosefs fuse-fd MNT --send SOCKET` passes the descriptor over a Unix
//!   socket (SCM_RIGHTS) to `loosefs fuse-fd --receive SOCKET -- COMMAND…` ([`receive`]) in the
//!   unprivileged container, which runs the daemon with it and holds the connection until the
//!   daemon ends; the sender then unmounts. The sender reaches the receiver before it mounts
//!   (a mount nobody serves would hang every `statfs` on it).
//! - SIGTERM, SIGINT or SIGHUP to `fuse-fd` unmounts what it mounted, which ends the daemon's
//!   session and so the daemon; no stale mount is left.

use super::session::{mount_fuse, set_read_ahead};
use super::unmount;
use crate::mount_table::mount_device;
use anyhow::{Context, Result, bail};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

/// The descriptor number `mnt` names when it is `/dev/fd/N` or `/proc/self/fd/N`.
pub fn handed_fd(mnt: &Path) -> Option<RawFd> {
    let s = mnt.to_str()?;
    let n = (s.strip_prefix("/dev/fd/")).or_else(|| s.strip_prefix("/proc/self/fd/"))?;
    n.parse().ok().filter(|&n| n >= 0)
}

/// Checks that descriptor `fd` is a mounted `/dev/fuse` connection whose FUSE_INIT waits.
///
/// Errors: it is not open, or it is another file (names what it is), or it is not mounted
/// yet, or another daemon already took the connection's FUSE_INIT.
pub fn check_handed(fd: RawFd) -> Result<()> {
    is_fuse_device(fd)?;
    // A mounted connection holds its FUSE_INIT from mount(2) until a daemon reads it: poll
    // tells an unmounted descriptor (POLLERR: the kernel's fuse_dev_poll without a
    // connection), and one whose INIT another daemon took (nothing to read; two daemons
    // on one connection would split its requests between them).
    let mut pfd = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one pollfd, owned here, for an open descriptor; a zero timeout never blocks.
    let n = unsafe { libc::poll(pfd.as_mut_ptr(), 1, 0) };
    if n < 0 {
        bail!("/dev/fd/{fd}: poll: {}", std::io::Error::last_os_error());
    }
    if pfd[0].revents & libc::POLLERR != 0 {
        bail!(
            "/dev/fd/{fd} is a /dev/fuse descriptor that is not mounted yet: mount it first \
             (`loosefs fuse-fd MNT -- …`, or mount(2) with fd=N), then hand it over"
        );
    }
    if pfd[0].revents & libc::POLLIN == 0 {
        bail!(
            "/dev/fd/{fd}: another daemon already serves this FUSE connection (its FUSE_INIT \
             was taken); a connection is served by one daemon: mount a new one for this daemon"
        );
    }
    Ok(())
}

/// Checks that descriptor `fd` is open on `/dev/fuse` (character device 10:229).
///
/// Errors: it is not open, or it is another file (names what it is).
pub fn is_fuse_device(fd: RawFd) -> Result<()> {
    // SAFETY: the descriptor is only borrowed for the fstat, and -1 (EBADF) is what a
    // descriptor that is not open gives.
    let borrowed = (fcntl_ok(fd)).then(|| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
    let st = (borrowed.ok_or(nix::errno::Errno::EBADF))
        .and_then(nix::sys::stat::fstat)
        .with_context(|| {
            format!(
                "/dev/fd/{fd}: no such descriptor; `loosefs mount SOURCE /dev/fd/N` serves a FUSE \
             connection handed over as descriptor N (see `loosefs fuse-fd`)"
            )
        })?;
    let is_char = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
    let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    if !is_char || (major, minor) != (10, 229) {
        bail!(
            "/dev/fd/{fd} is not a /dev/fuse descriptor (mode {:o}, device {major}:{minor}); \
             hand over the descriptor of an opened and mounted /dev/fuse (see `loosefs fuse-fd`)",
            st.st_mode
        );
    }
    Ok(())
}

/// Marks descriptor `fd` close-on-exec (a number that is not open is left alone).
pub(super) fn set_cloexec(fd: RawFd) {
    // SAFETY: F_GETFD/F_SETFD only change the descriptor's flags; a number that is not open
    // answers EBADF.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

/// Makes this process's descriptor `src` the child's descriptor `fd` (close-on-exec cleared),
/// between fork and exec: how a FUSE connection (or a pipe) is handed to a child, by
/// `fuse-fd`, the keeper and the CSI mounter. Several placements run in the order given.
pub(crate) fn place_fd(cmd: &mut std::process::Command, src: RawFd, fd: RawFd) {
    // SAFETY: between fork and exec only async-signal-safe calls: dup2 (which clears
    // FD_CLOEXEC on the new descriptor) and fcntl.
    unsafe {
        cmd.pre_exec(move || {
            if src == fd {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(src, fd) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether descriptor `fd` is an open pipe.
pub(super) fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: the descriptor is only borrowed for the fstat.
    let st = fcntl_ok(fd).then(|| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
    st.and_then(|b| nix::sys::stat::fstat(b).ok())
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// Whether `fd` is an open descriptor of this process.
fn fcntl_ok(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags; an fd that is not open gives EBADF.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Where `loosefs fuse-fd` hands the descriptor over.
#[derive(Debug, Clone)]
pub enum Handover {
    /// To `command`, started here, as its descriptor number `fd`.
    Run {
        /// Descriptor number the command gets (3 or more).
        fd: RawFd,
        /// The command and its arguments.
        command: Vec<std::ffi::OsString>,
    },
    /// Over the Unix socket at this path (SCM_RIGHTS), to a `loosefs fuse-fd --receive` there,
    /// whose connection is held for as long as it runs the daemon.
    Send(std::path::PathBuf),
}

/// How long `--send` keeps trying to reach a receiver that is not listening yet.
const CONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// `loosefs fuse-fd MNT [--allow-other] [--owner USER] [--read-ahead-kb K] (-- COMMAND… |
/// --send SOCKET)` (root): mounts a FUSE connection at `mnt` (type `fuse.loosefs`,
/// `nosuid,nodev,noatime,default_permissions`, `allow_other` when asked, belonging to `owner`
/// (default root): without `allow_other` only that user can use it), hands its descriptor over as `to` says,
/// waits until the daemon's side ends (the command exits, or the receiver closes the socket),
/// then unmounts `mnt` if it is still that mount. Returns the command's exit code (128 +
/// signal if it was killed; 0 for `--send`).
///
/// Errors: not root, `mnt` cannot be mounted, the command cannot start, no receiver listens
/// at the socket within a minute.
pub fn fuse_fd(
    mnt: &Path,
    allow_other: bool,
    owner: Option<&str>,
    read_ahead_kb: u32,
    to: &Handover,
) -> Result<i32> {
    if let Handover::Run { fd, command } = to {
        check_command(*fd, command)?;
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("loosefs fuse-fd mounts (mount(2)) and must run as root");
    }
    let owner = owner.map(user_ids).transpose()?;
    let abs = super::check_mountpoint(mnt)?;
    let mnt = abs.as_path();
    // A receiver is reached before anything is mounted: a mount no daemon serves yet would
    // hang every statfs and lookup on it (node agents statfs every mount) while it waits.
    let conn = match to {
        Handover::Send(socket) => Some(connect(socket)?),
        Handover::Run { .. } => None,
    };
    let name = super::session::fs_name(mnt);
    // SIGTERM, SIGINT and SIGHUP from here on unmount what this mounted (ending the daemon's
    // session, then the daemon and its side), instead of leaving a stale mount.
    let ours = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .context("cannot handle signals")?;
    let signals_handle = signals.handle();
    {
        let (ours, mnt) = (ours.clone(), mnt.to_path_buf());
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let dev = ours.lock().unwrap_or_else(|p| p.into_inner()).clone();
                match dev {
                    Some(dev) if mount_device(&mnt).as_ref() == Some(&dev) => {
                        log::info!("signal {sig}: unmounting {}", mnt.display());
                        if let Err(e) = unmount(&mnt, true) {
                            log::error!("{e:#}");
                        }
                    }
                    // Not mounted yet (or no longer ours): nothing to clean up.
                    _ => std::process::exit(128 + sig),
                }
            }
        });
    }
    let dev = mount_fuse(mnt, &format!("loosefs:{name}"), allow_other, owner, false)
        .with_context(|| format!("cannot mount at {}", mnt.display()))?;
    let device = mount_device(mnt);
    *ours.lock().unwrap_or_else(|p| p.into_inner()) = device.clone();
    if read_ahead_kb > 0
        && let Err(e) = set_read_ahead(mnt, read_ahead_kb)
    {
        log::warn!("cannot set read_ahead_kb for {}: {e}", mnt.display());
    }
    let served = match (to, conn) {
        (Handover::Send(socket), Some(conn)) => send(dev, conn, socket).map(|()| 0),
        (Handover::Run { fd, command }, _) => run_with(dev, *fd, command),
        (Handover::Send(socket), None) => Err(anyhow::anyhow!(
            "{}: not connected to a receiver",
            socket.display()
        )),
    };
    signals_handle.close();
    if device.is_some() && mount_device(mnt) == device {
        unmount(mnt, true)?;
        log::info!("the daemon's side ended; unmounted {}", mnt.display());
    }
    served
}

/// The uid and primary gid of `user` (a name, or a number with or without a passwd entry).
/// Errors: a name no passwd entry has.
fn user_ids(user: &str) -> Result<(u32, u32)> {
    use nix::unistd::{Uid, User};
    let found = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or((uid, uid), |u| (uid, u.gid.as_raw())),
        Err(_) => User::from_name(user)
            .ok()
            .flatten()
            .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
            .ok_or_else(|| anyhow::anyhow!("--owner {user}: no such user"))?,
    };
    Ok(found)
}

/// `loosefs fuse-fd --receive SOCKET -- COMMAND…` (no privilege): listens at `socket` (a
/// stale socket file there is replaced), takes one FUSE descriptor from the first sender,
/// runs `command` with it as descriptor `fd`, and holds the sender's connection until the
/// command exits (the sender then unmounts). Returns the command's exit code.
///
/// Errors: the socket cannot be made, the sender sends no descriptor, the command cannot
/// start.
pub fn receive(socket: &Path, fd: RawFd, command: &[std::ffi::OsString]) -> Result<i32> {
    check_command(fd, command)?;
    if std::fs::symlink_metadata(socket).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_socket()
    }) {
        std::fs::remove_file(socket)
            .with_context(|| format!("cannot replace {}", socket.display()))?;
    }
    let listener = std::os::unix::net::UnixListener::bind(socket)
        .with_context(|| format!("cannot listen at {}", socket.display()))?;
    let (conn, _) = listener
        .accept()
        .with_context(|| format!("cannot accept at {}", socket.display()))?;
    let dev = recv_fd(&conn, socket)?;
    check_handed(dev.as_raw_fd())?;
    let _ = std::fs::remove_file(socket);
    let code = run_with(dev, fd, command);
    drop(conn);
    code
}

/// Refuses an empty command or a descriptor number among the standard streams.
fn check_command(fd: RawFd, command: &[std::ffi::OsString]) -> Result<()> {
    if command.is_empty() {
        bail!("give the command to run with the descriptor after `--`");
    }
    if fd < 3 {
        bail!("--fd {fd}: 0, 1 and 2 are the command's standard streams; give 3 or more");
    }
    Ok(())
}

/// Runs `command` with `dev` as its descriptor `fd` (and `LOOSEFS_FUSE_FD=fd` in its
/// environment), closes this process's copy, and waits for it: its exit code, or 128 + the
/// signal that ended it.
fn run_with(dev: std::os::fd::OwnedFd, fd: RawFd, command: &[std::ffi::OsString]) -> Result<i32> {
    let src = dev.as_raw_fd();
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LOOSEFS_FUSE_FD", fd.to_string());
    place_fd(&mut cmd, src, fd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {:?}", command[0]))?;
    // The daemon holds the connection now; this copy would keep it alive after the daemon died.
    drop(dev);
    let status = child.wait().context("cannot wait for the command")?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Connects to the receiver at `socket`, retrying for [`CONNECT_FOR`] while nothing listens
/// there yet. Errors: no receiver within that time, or another error, naming the socket.
fn connect(socket: &Path) -> Result<std::os::unix::net::UnixStream> {
    let t0 = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(10);
    loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(c) => return Ok(c),
            Err(e)
                if t0.elapsed() < CONNECT_FOR
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                std::thread::sleep(wait);
                wait = (wait * 2).min(std::time::Duration::from_secs(1));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot reach a receiver at {} (`loosefs fuse-fd --receive {0} -- …`)",
                        socket.display()
                    )
                });
            }
        }
    }
}

/// Sends `dev` over `conn` (connected to the receiver at `socket`), closes this process's
/// copy, and waits until the receiver closes the connection.
fn send(
    dev: std::os::fd::OwnedFd,
    mut conn: std::os::unix::net::UnixStream,
    socket: &Path,
) -> Result<()> {
    use std::io::Read;
    send_fd(&conn, dev, socket)?;
    // The receiver holds the connection while its daemon runs.
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    Ok(())
}

/// Receives one descriptor (SCM_RIGHTS, with its one-byte message) from `conn`, connected
/// through `socket` (named in errors). Errors: the peer sent no descriptor, or closed.
pub(crate) fn recv_fd(
    conn: &std::os::unix::net::UnixStream,
    socket: &Path,
) -> Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .with_context(|| format!("cannot receive from {}", socket.display()))?;
    let mut got = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for f in fds {
                // SAFETY: SCM_RIGHTS gave this process a new descriptor that nothing owns yet.
                let owned =
                    unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(f) };
                got.get_or_insert(owned);
            }
        }
    }
    let dev =
        got.ok_or_else(|| anyhow::anyhow!("{}: the sender sent no descriptor", socket.display()))?;
    Ok(dev)
}

/// Sends `dev` over `conn` (SCM_RIGHTS with a one-byte message), connected through `socket`
/// (named in errors); this process's copy is closed.
pub(crate) fn send_fd(
    conn: &std::os::unix::net::UnixStream,
    dev: std::os::fd::OwnedFd,
    socket: &Path,
) -> Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [dev.as_raw_fd()];
    let iov = [std::io::IoSlice::new(b"F")];
    sendmsg::<()>(
        conn.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .with_context(|| format!("cannot send the descriptor to {}", socket.display()))?;
    drop(dev);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_descriptor_is_named_by_dev_fd_or_proc_self_fd() {
        assert_eq!(handed_fd(Path::new("/dev/fd/3")), Some(3));
        assert_eq!(handed_fd(Path::new("/proc/self/fd/17")), Some(17));
        assert_eq!(handed_fd(Path::new("/dev/fd/x")), None);
        assert_eq!(handed_fd(Path::new("/mnt/dev/fd/3")), None);
        assert_eq!(handed_fd(Path::new("/dev/fd/")), None);
    }

    #[test]
    fn a_descriptor_that_is_not_dev_fuse_is_refused_naming_it() {
        let f = tempfile::tempfile().unwrap();
        let e = check_handed(f.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("is not a /dev/fuse descriptor"), "{e}");
        let e = check_handed(9999).unwrap_err().to_string();
        assert!(e.contains("no such descriptor"), "{e}");
    }
}
