//! The FUSE session of a mount and what runs beside it: the kernel mount (type
//! `fuse.loosefs`, as root), the session's configuration, the lease on a native pack (a writer
//! opening it is noticed), the mount's read-ahead, and the wait for a signal or the unmount.

use super::DaemonOptions;
use super::{FS_TYPE, mount_device, unmount};
use crate::fuse::LooseFs;
use anyhow::{Context, Result};
use fuser::{Config, MountOption, Session, SessionACL};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// The name a mount of `path` shows (`loosefs:<name>`): its file name, with characters other
/// than ASCII letters, digits and `._-` replaced by `_`.
pub(super) fn fs_name(path: &Path) -> String {
    path.file_name()
        .map(|n| {
            n.to_string_lossy()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "._-".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The FUSE session serving `fs` at `mnt`: writable only where the daemon says so (the
/// announced order; every other change answers EROFS, see [`crate::fuse`]), noatime, default permissions, the
/// owner only unless `--allow-other`, `--threads` workers with a cloned fd each. As root the
/// mount is made here (type `fuse.loosefs`); otherwise through fusermount; with `handed`
/// (`mnt` is `/dev/fd/N`), descriptor N is served as handed over (the mount options are the
/// mounter's).
///
/// With `kept` (a daemon started by the mount's keeper), the connection is already mounted and
/// initialised: fuser's session is built on a replayed FUSE_INIT ([`crate::fuse::takeover`])
/// and then reads the keeper's device (`resend`) or a clone of its own. `shared` (a first
/// daemon whose keeper will resend) keeps every thread on the one device the keeper shares.
pub(super) fn open_session(
    fs: LooseFs,
    mnt: &Path,
    name: &str,
    opts: &DaemonOptions,
    handed: Option<std::os::fd::RawFd>,
    kept: Option<crate::fuse::takeover::Takeover>,
    shared: bool,
) -> Result<Session<LooseFs>> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
        MountOption::FSName(format!("loosefs:{name}")),
        MountOption::Subtype("loosefs".into()),
    ];
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    // A thread per cloned device, except where the keeper resends: a clone's requests end
    // with the daemon, the shared device's wait for the next one.
    cfg.clone_fd = !(shared || kept.as_ref().is_some_and(|k| k.resend));
    if handed.is_some() {
        // Who may use the mount is the mounter's choice (`allow_other` or not), enforced by
        // the kernel before a request reaches this daemon, whose own user is then not the
        // point.
        cfg.acl = SessionACL::All;
    }
    let session = if let Some(k) = kept {
        return kept_session(fs, k, cfg)
            .with_context(|| format!("cannot take over the connection of {}", mnt.display()));
    } else if let Some(n) = handed {
        // Checked by `mountpoint_or_fd`: an open /dev/fuse descriptor, handed to this process.
        cfg.clone_fd = cfg.clone_fd && can_open_dev_fuse();
        // SAFETY: descriptor n was handed to this process to serve, and nothing else in it
        // owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(n) };
        let acl = cfg.acl;
        Session::from_fd(fs, fd, acl, cfg)
    } else if nix::unistd::geteuid().is_root() {
        let source = format!("loosefs:{name}");
        let fd = mount_fuse(mnt, &source, opts.allow_other, None, false)
            .with_context(|| format!("cannot mount at {}", mnt.display()))?;
        let acl = cfg.acl;
        Session::from_fd(fs, fd, acl, cfg)
    } else {
        Session::new(fs, mnt, &cfg).map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => std::io::Error::new(
                e.kind(),
                format!(
                    "{e}: a user's mount needs /dev/fuse readable and writable by the user \
                     (mode 0666, the distribution default; it is {}) and fusermount3 (setuid \
                     root, from the fuse3 package); or mount as root",
                    dev_fuse_mode()
                ),
            ),
            _ => e,
        })
    }
    .with_context(|| format!("cannot mount at {}", mnt.display()))?;
    Ok(session)
}

/// fuser's session on the kept connection `k`: the handshake replayed on a socket pair, then
/// the session's descriptor made the connection's (the keeper's device, or a clone of it
/// without resend).
fn kept_session(
    fs: LooseFs,
    k: crate::fuse::takeover::Takeover,
    cfg: Config,
) -> Result<Session<LooseFs>> {
    use crate::fuse::takeover;
    let (replayed, fusers) = takeover::Replayed::new(&k.offer)?;
    let number = fusers.as_raw_fd();
    let acl = cfg.acl;
    let session = Session::from_fd(fs, fusers, acl, cfg).context("fuser's replayed handshake")?;
    if k.resend {
        replayed.attach(number, &k.dev)?;
    } else {
        replayed.attach(number, takeover::clone_device(&k.dev)?)?;
    }
    Ok(session)
}

/// Whether this process can open `/dev/fuse` (a descriptor per FUSE thread is cloned from it;
/// a container without the device shares the handed-over one between threads).
fn can_open_dev_fuse() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

/// `/dev/fuse`'s permission bits, as `0666`, or why they cannot be read.
fn dev_fuse_mode() -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata("/dev/fuse").map_or_else(
        |e| format!("unreadable: {e}"),
        |m| format!("{:04o}", m.permissions().mode() & 0o7777),
    )
}

/// Waits for a signal: SIGIO (the leased pack was opened for writing: the server watches it
/// for changes from then on, and the lease is given up so the writer proceeds) or
/// SIGINT/SIGTERM/SIGHUP (unmounts `mnt` if it is still this mount), or the session's end.
pub(super) fn serve_until_signal(
    mnt: &Path,
    signals: signal_hook::iterator::Signals,
    bg: &fuser::BackgroundSession,
    server: &crate::fs::Fs,
    lease: Option<&Lease>,
    pack_path: &Path,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let signals_handle = signals.handle();
    std::thread::spawn(move || {
        let mut signals = signals;
        if let Some(sig) = signals.forever().next() {
            let _ = tx.send(sig);
        }
    });
    // The mount's device: a signal unmounts `mnt` only while this mount is still the one there.
    let our_dev = mount_device(mnt);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(signal_hook::consts::SIGIO) => {
                if let Some(l) = lease {
                    if !server.opened_for_writing() {
                        log::warn!(
                            "{} was opened for writing while mounted; changes to it cannot be \
                             told from here",
                            pack_path.display()
                        );
                    }
                    l.release();
                }
            }
            Ok(sig) => {
                if our_dev.is_some() && mount_device(mnt) == our_dev {
                    log::info!("signal {sig}: unmounting {}", mnt.display());
                    if let Err(e) = unmount(mnt, true) {
                        log::error!("{e:#}");
                    }
                } else {
                    log::info!("signal {sig}: {} is no longer this mount", mnt.display());
                }
                break;
            }
            Err(_) if bg.guard.is_finished() => break,
            Err(_) => {}
        }
    }
    signals_handle.close();
}

/// Mounts a FUSE filesystem of type [`FS_TYPE`] at `mnt` (root only) and returns the
/// `/dev/fuse` descriptor that serves it: read-only, `nosuid`, `nodev`, `noatime`,
/// `default_permissions`, and `allow_other` when asked (`MS_RDONLY` too when `read_only`:
/// opens for writing then fail with EROFS in the kernel). It belongs to `owner` (uid, gid;
/// default: this process's): without `allow_other`, the kernel lets only that user use it.
/// (fuser's own mount names every filesystem plain `fuse`.)
pub(crate) fn mount_fuse(
    mnt: &Path,
    source: &str,
    allow_other: bool,
    owner: Option<(u32, u32)>,
    read_only: bool,
) -> Result<OwnedFd> {
    use nix::mount::MsFlags;
    use std::os::unix::fs::PermissionsExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("cannot open /dev/fuse (is the fuse module loaded?)")?;
    let rootmode = std::fs::metadata(mnt)?.permissions().mode();
    let (uid, gid) = owner.unwrap_or((
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    ));
    let mut data = format!(
        "fd={},rootmode={rootmode:o},user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd(),
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    nix::mount::mount(Some(source), mnt, Some(FS_TYPE), flags, Some(data.as_str()))
        .with_context(|| format!("mount(2) of type {FS_TYPE}"))?;
    Ok(OwnedFd::from(dev))
}

/// A read lease on the pack (`fcntl(F_SETLEASE, F_RDLCK)`): a process that opens the pack for
/// writing or truncates it is held in `open`/`truncate` while the kernel sends the daemon
/// SIGIO, so the daemon stops reading the pack before any byte of it changes, then releases
/// the lease. Replacing a pack by rename touches no lease: the mount keeps the old file.
pub(super) struct Lease {
    file: std::fs::File,
}

impl Lease {
    /// Takes the lease on `file` (the pack at `path`); `None`, with a warning, where leases are
    /// not available (the filesystem, or another process has the pack open for writing).
    pub(super) fn take(path: &Path, file: std::fs::File) -> Option<Lease> {
        // SAFETY: fcntl on an fd this process owns; F_SETLEASE takes an integer argument.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        if rc != 0 {
            log::warn!(
                "cannot take a lease on {}: {}; modifying it in place while mounted will not be \
                 detected (replace a pack by writing a new file and renaming it over the old one)",
                path.display(),
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Lease { file })
    }

    /// Gives the lease up, letting the writer proceed. Waits briefly first so that requests
    /// already past the catalog's check finish reading the mapped index.
    fn release(&self) {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: as in `take`.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

/// Raises the kernel read-ahead of the mount's bdi (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`).
pub(super) fn set_read_ahead(mnt: &Path, kb: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mnt)?.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    std::fs::write(&path, kb.to_string()).with_context(|| format!("cannot write {path}"))?;
    Ok(())
}
