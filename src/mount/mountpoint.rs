//! Checks on a path about to become a mountpoint: a directory, empty unless asked, not a mount
//! already, not a stale mount left by a daemon that died; or a `/dev/fd/N` handed over. Every
//! refusal is bad usage (exit code 2) unless the user may not look at the path.

use super::handover;
use crate::mount_table::{daemon_gone, mount_fstype, stale_message};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The mountpoint made absolute ([`check_mountpoint`]; a directory holding files refused
/// unless `allow_non_empty`), or `/dev/fd/N` as given once [`handover::check_handed`] has
/// checked that descriptor N is a `/dev/fuse` one.
pub(super) fn mountpoint_or_fd(mnt: &Path, allow_non_empty: bool) -> Result<PathBuf> {
    match handover::handed_fd(mnt) {
        Some(fd) => handover::check_handed(fd).map(|()| mnt.to_path_buf()),
        None => {
            let abs = check_mountpoint(mnt)?;
            if !allow_non_empty {
                check_empty(mnt, &abs).map_err(mountpoint_refused)?;
            }
            Ok(abs)
        }
    }
}

/// Refuses a mountpoint that holds files: mounted over, they would be hidden (and a mistyped
/// mountpoint, `~` for `~/mnt`, would hide a home). Errors: naming one of them and the flag.
fn check_empty(mnt: &Path, abs: &Path) -> Result<()> {
    let first = std::fs::read_dir(abs)
        .with_context(|| format!("cannot list mountpoint {}", mnt.display()))?
        .flatten()
        .next();
    if let Some(e) = first {
        bail!(
            "mountpoint {} is not empty (it holds {:?}, hidden while mounted): choose an empty \
             directory, or give --allow-non-empty",
            mnt.display(),
            e.file_name()
        );
    }
    Ok(())
}

/// State of a path that is about to become a mountpoint: its canonical path. Errors (bad
/// usage, [`crate::exit_code`], unless the user may not look at it): it is missing, not a
/// directory, a mount already, or a stale mount whose daemon died.
pub(super) fn check_mountpoint(mnt: &Path) -> Result<PathBuf> {
    check_mountpoint_in(mnt).map_err(mountpoint_refused)
}

/// A mountpoint refused: bad usage (the command line named a path that cannot be mounted on),
/// unless the user may not look at it (permission denied keeps its kind).
fn mountpoint_refused(e: anyhow::Error) -> anyhow::Error {
    use crate::exit_code::{ExitKind, with_kind};
    match ExitKind::of(&e) {
        ExitKind::Denied => e,
        _ => with_kind(e, ExitKind::Usage),
    }
}

fn check_mountpoint_in(mnt: &Path) -> Result<PathBuf> {
    match std::fs::metadata(mnt) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mountpoint {} is not a directory", mnt.display()),
        Err(e) if e.raw_os_error().is_some_and(daemon_gone) => bail!(stale_message(mnt)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "mountpoint {} does not exist (create it with `mkdir -p {0}`)",
                mnt.display()
            )
        }
        Err(e) => {
            return Err(anyhow::Error::new(e))
                .with_context(|| format!("cannot use mountpoint {}", mnt.display()));
        }
    }
    let abs =
        std::fs::canonicalize(mnt).with_context(|| format!("cannot resolve {}", mnt.display()))?;
    if let Some(fstype) = mount_fstype(&abs) {
        // statfs always reaches the daemon (the kernel caches no answer), so it tells a live
        // FUSE mount from one whose daemon died even while attributes are still cached.
        if let Err(e) = nix::sys::statvfs::statvfs(&abs)
            && daemon_gone(e as i32)
        {
            bail!(stale_message(mnt));
        }
        bail!(
            "{} is already a mount point ({fstype}); unmount it first",
            mnt.display()
        );
    }
    Ok(abs)
}
