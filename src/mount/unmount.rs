//! Unmounting: `loosefs umount` (only a loosefs mount, live or stale; a busy one refused or
//! detached; a daemon that does not answer has its FUSE connection aborted), and the FUSE
//! connection's fusectl directory.

use crate::mount_table::{mount_device, mount_fstype, mount_source};
use anyhow::{Context, Result, bail};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// `loosefs umount`: [`unmount`], then waits (up to 15 s) for the daemon to finish its exit
/// (a remote pack's block cache is made durable and marked clean on the way out), so a mount
/// of the same pack right after finds everything in place.
pub fn unmount_and_wait(mnt: &Path, lazy_if_busy: bool) -> Result<()> {
    let abs = std::path::absolute(mnt)?;
    is_loosefs_mount(&abs, mnt)?;
    // The daemon's pid is in its stats; a daemon that does not answer (stopped, hung, its
    // process frozen) would leave this read, and then any access to the mount, waiting for
    // ever: it gets a few seconds, then its FUSE connection is aborted (every request waiting
    // on it fails with ENOTCONN) and the mount taken down.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let mnt = abs.clone();
        std::thread::spawn(move || {
            let _ = tx.send(crate::client::read_control::<crate::report::Report>(
                &mnt, "stats",
            ));
        });
    }
    let pid = match rx.recv_timeout(Duration::from_secs(ANSWER_SECS)) {
        Ok(r) => r.ok().map(|r| r.daemon.pid),
        Err(_) if mount_fstype(&abs).is_some() => {
            abort_connection(&abs)?;
            // The aborted stats read ends (ENOTCONN) and lets go of the mount. Over FUSE over
            // io_uring (Linux 6.18) a request already handed to a ring entry ends only when
            // the daemon's rings close: a daemon still holding it is killed (it serves
            // nothing any more), else this command could not exit.
            if rx.recv_timeout(Duration::from_secs(ANSWER_SECS)).is_err() {
                if let Some(pid) = daemon_of(&abs) {
                    log::warn!("{}: killing its daemon (pid {pid})", abs.display());
                    crate::eprintln_lossy!(
                        "loosefs: {}: killing its daemon (pid {pid})",
                        abs.display()
                    );
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = rx.recv_timeout(Duration::from_secs(ANSWER_SECS));
                }
            }
            // What is left serves nothing: detached even when a reader still holds it.
            return unmount(mnt, true);
        }
        Err(_) => None,
    };
    unmount(mnt, lazy_if_busy)?;
    if let Some(pid) = pid {
        let stat = format!("/proc/{pid}/stat");
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            // Gone, or a zombie waiting for its parent: either way it has finished.
            match std::fs::read_to_string(&stat) {
                Ok(s)
                    if !s
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z') => {}
                _ => break,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Seconds `loosefs umount` waits for the daemon to answer its stats before it aborts the
/// mount's FUSE connection.
const ANSWER_SECS: u64 = 5;

/// The pid of the loosefs daemon serving the mount at `abs`: a `loosefs mount` process whose
/// command line names it (a relative name taken from that process's working directory). No
/// request reaches the mount.
fn daemon_of(abs: &Path) -> Option<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        if pid == me {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let exe = Path::new(std::ffi::OsStr::from_bytes(args.first()?));
        if exe.file_name()? != "loosefs" || !args.iter().any(|a| *a == b"mount") {
            return None;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        args.iter()
            .any(|a| cwd.join(std::ffi::OsStr::from_bytes(a)) == abs)
            .then_some(pid)
    })
}

/// Aborts the FUSE connection of the mount at `abs` (found in /proc/self/mountinfo, so no
/// request reaches the daemon): `/sys/fs/fuse/connections/N/abort`, as `fusectl` documents it.
/// Every request waiting on the daemon fails (ENOTCONN), and the mount can be taken down.
///
/// Errors: the mount's device is unknown, or the connection cannot be aborted (not root, no
/// fusectl mounted): the message says how to do it by hand.
fn abort_connection(abs: &Path) -> Result<()> {
    let ctl = connection_dir(abs)
        .context("the mount's device is not in /proc/self/mountinfo")?
        .join("abort");
    log::warn!(
        "{}: the daemon does not answer within {ANSWER_SECS} s; aborting its FUSE connection ({})",
        abs.display(),
        ctl.display()
    );
    crate::eprintln_lossy!(
        "loosefs: {}: the daemon does not answer; aborting its FUSE connection",
        abs.display()
    );
    std::fs::write(&ctl, b"1").with_context(|| {
        format!(
            "{}: the daemon does not answer, and its connection cannot be aborted through {} (as root: `echo 1 > {}`, then `umount -l {}`)",
            abs.display(),
            ctl.display(),
            ctl.display(),
            abs.display()
        )
    })
}

/// Unmounts `mnt`. A busy mount (open files, a cwd inside) is refused unless `lazy_if_busy`,
/// which detaches it (it goes away when the last user leaves). Stale mounts left by a dead
/// daemon are unmounted too.
///
/// Errors: `mnt` is not a mount point, or not a loosefs mount (another file system's is
/// never unmounted); busy without `lazy_if_busy`; permission denied.
pub fn unmount(mnt: &Path, lazy_if_busy: bool) -> Result<()> {
    use nix::mount::{MntFlags, umount2};
    let abs = std::path::absolute(mnt)?;
    is_loosefs_mount(&abs, mnt)?;
    match umount2(&abs, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EBUSY) if lazy_if_busy => {
            log::warn!("{} is busy; detaching it lazily", mnt.display());
            umount2(&abs, MntFlags::MNT_DETACH)
                .with_context(|| format!("cannot detach {}", mnt.display()))
        }
        Err(nix::errno::Errno::EBUSY) => Err(busy(mnt)),
        // A user's own FUSE mount (made through the setuid fusermount3): it unmounts it.
        Err(nix::errno::Errno::EPERM) if !nix::unistd::geteuid().is_root() => {
            fusermount_unmount(&abs, lazy_if_busy)
        }
        Err(e) => Err(e).with_context(|| format!("cannot unmount {}", mnt.display())),
    }
}

/// The refusal to unmount a busy `mnt`, with what to do about it.
fn busy(mnt: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is busy (a process has a file open or its working directory there); close it, or use `loosefs umount --lazy`",
        mnt.display()
    )
}

/// Unmounts `mnt` with `fusermount3 -u` (or `fusermount -u`), which lets a user unmount a FUSE
/// mount of their own; `-z` detaches a busy one when `lazy`. Errors: neither is installed, or
/// it refused (its message is given).
fn fusermount_unmount(mnt: &Path, lazy: bool) -> Result<()> {
    let mut last = None;
    for tool in ["fusermount3", "fusermount"] {
        let flags = if lazy { "-uz" } else { "-u" };
        match std::process::Command::new(tool)
            .arg(flags)
            .arg(mnt)
            .output()
        {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).trim().to_string();
                if why.contains("busy") && !lazy {
                    return Err(busy(mnt));
                }
                bail!("cannot unmount {}: {tool}: {why}", mnt.display());
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no fusermount"), anyhow::Error::from)).with_context(|| {
        format!(
            "cannot unmount {}: not permitted, and neither fusermount3 nor fusermount is installed",
            mnt.display()
        )
    })
}

/// Checks that the mount at `abs` (given as `mnt`) is a loosefs mount, live or left by a
/// daemon that died: a FUSE mount whose source is `loosefs:NAME`, as every loosefs mount
/// names itself. Errors: no mount there, or another file system's (named, with its source),
/// which `loosefs umount` leaves alone.
fn is_loosefs_mount(abs: &Path, mnt: &Path) -> Result<()> {
    let Some(fstype) = mount_fstype(abs) else {
        bail!("{} is not a mount point", mnt.display());
    };
    let source = mount_source(abs).unwrap_or_default();
    if !(fstype.starts_with("fuse") && source.starts_with("loosefs:")) {
        bail!(
            "{} is not a loosefs mount (it is a {fstype} mount of {source}): loosefs umount \
             leaves it alone (use umount(8) if you mean it)",
            mnt.display()
        );
    }
    Ok(())
}

/// The fusectl directory of the FUSE connection of the mount at exactly `abs`
/// (`/sys/fs/fuse/connections/N`, N the mount's device minor, found in mountinfo: nothing is
/// asked of the mount, so this never waits on its daemon). fusectl is mounted there first if
/// it is not (a container, a minimal VM; root only). `None`: `abs` is not a mount point.
pub fn connection_dir(abs: &Path) -> Option<std::path::PathBuf> {
    let dev = mount_device(abs)?;
    let minor = dev.rsplit(':').next().unwrap_or("");
    let connections = Path::new("/sys/fs/fuse/connections");
    if !connections.join(minor).exists() {
        let _ = nix::mount::mount(
            Some("fusectl"),
            connections,
            Some("fusectl"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
    }
    Some(connections.join(minor))
}
