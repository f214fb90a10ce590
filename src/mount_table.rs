//! The mount table (`/proc/self/mountinfo`) as loosefs reads it, and what a mount that does not
//! answer means: the file system type, source and device of the mount at a path, read without
//! any request reaching the mount (so never waiting on a FUSE daemon), and the one-line
//! messages for a mount whose daemon is gone or that is not loosefs's (with where its daemon
//! logged by default); a mountpoint resolved once, never asked again.

use std::path::{Path, PathBuf};

/// Why `mnt`'s control file could not be read (`error`, the read's), in one line with its fix:
/// not mounted, another file system's mount, a mount whose daemon died (with where its log
/// is, when it is the default one), or else `error` itself. Reads only the mount table and
/// `statfs`, never a file of the mount.
pub fn why_no_answer(mnt: &Path, error: &std::io::Error) -> String {
    let abs = std::fs::canonicalize(mnt)
        .or_else(|_| std::path::absolute(mnt))
        .unwrap_or_else(|_| mnt.to_path_buf());
    let gone = |e: i32| daemon_gone(e);
    if error.raw_os_error().is_some_and(gone) {
        let log = default_log_path(&abs);
        let stale = stale_message(mnt).replace('\n', " ");
        return format!(
            "{} Why it died is in its log ({}, unless it was started with --log).",
            stale.trim_end(),
            log.display()
        );
    }
    match mount_fstype(&abs) {
        None => format!(
            "{} is not mounted (mount it with `loosefs mount SOURCE {0}`)",
            mnt.display()
        ),
        Some(t)
            if !t.starts_with("fuse")
                || mount_source(&abs).is_none_or(|s| !s.starts_with("loosefs:")) =>
        {
            format!("{} is a {t} mount, not a loosefs mount", mnt.display())
        }
        Some(_) => format!("{}: {error}", mnt.display()),
    }
}

/// Whether `errno`, answered for a FUSE mountpoint, means its daemon is gone: ENOTCONN or
/// ECONNABORTED once the kernel has aborted the connection, and ECANCELED before that over
/// FUSE-over-io_uring — a request queued to a ring entry whose task died is cancelled
/// (`fs/fuse/dev_uring.c`) until the ring's teardown, which runs after the process has exited,
/// releases `/dev/fuse` and aborts the connection.
pub(crate) fn daemon_gone(errno: i32) -> bool {
    matches!(errno, libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
}

pub(crate) fn stale_message(mnt: &Path) -> String {
    format!(
        "mountpoint {0} is a stale FUSE mount: the daemon that served it has died, so using it fails with \"Transport endpoint is not connected\", \"Software caused connection abort\" or \"Operation canceled\".\n\
         Fix: `loosefs umount {0}` (or `umount -l {0}` / `fusermount3 -uz {0}`), then mount again.",
        mnt.display()
    )
}

/// Filesystem type of a loosefs mount, as `/proc/mounts`, `findmnt`, `df -T` and fstab name it.
pub const FS_TYPE: &str = "fuse.loosefs";

/// Whether the mount at exactly `path` is a loosefs mount of source `source` (`loosefs:NAME`),
/// from /proc/self/mountinfo.
pub(crate) fn is_loosefs_mount_of(path: &Path, source: &str) -> bool {
    mount_fstype(path).as_deref() == Some(FS_TYPE) && mount_source(path).as_deref() == Some(source)
}

/// Every mount point (unescaped) in /proc/self/mountinfo: what a caller must not `stat` when a
/// FUSE daemon there may not answer.
pub(crate) fn mount_points() -> std::collections::HashSet<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Default::default();
    };
    info.split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(|m| std::ffi::OsString::from_vec(unescape_mountinfo(m)).into())
        .collect()
}

/// Every mount point (as given to mount(2), unescaped) of a loosefs mount of source `source`
/// (`loosefs:NAME`): the mount itself and each bind mount of it, from /proc/self/mountinfo.
pub(crate) fn loosefs_mount_points_of(source: &str) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.split(|&b| b == b'\n')
        .filter_map(|line| {
            let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = f.iter().position(|&x| x == b"-")?;
            let ours = *f.get(sep + 1)? == FS_TYPE.as_bytes()
                && unescape_mountinfo(f.get(sep + 2)?) == source.as_bytes();
            ours.then(|| std::ffi::OsString::from_vec(unescape_mountinfo(f[4])).into())
        })
        .collect()
}

/// The filesystem type of the mount at exactly `path`, from /proc/self/mountinfo.
pub fn mount_fstype(path: &Path) -> Option<String> {
    mountinfo_field(path, |f, sep| f.get(sep + 1).copied())
}

/// The source of the mount at exactly `path` (`loosefs:NAME` for a loosefs mount), from
/// /proc/self/mountinfo (no request reaches the filesystem).
pub(crate) fn mount_source(path: &Path) -> Option<String> {
    mountinfo_field(path, |f, sep| f.get(sep + 2).copied())
}

/// The device (`major:minor`) of the mount at exactly `path`, from /proc/self/mountinfo (no
/// request reaches the filesystem, so this never waits on a FUSE daemon).
pub(crate) fn mount_device(path: &Path) -> Option<String> {
    mountinfo_field(path, |f, _| f.get(2).copied())
}

/// A field (chosen by `pick` from the line's fields and the position of its `-` separator) of
/// the last line of /proc/self/mountinfo whose mount point is exactly `path`. Compared as
/// bytes: a mount point that is not UTF-8 is found too (the kernel escapes space, tab, newline
/// and backslash, and `#` in the source), and such a line elsewhere does not hide the others.
/// The field picked is unescaped too (a source `loosefs:csi/rg#acct` reads back as given).
fn mountinfo_field(
    path: &Path,
    pick: impl for<'a> Fn(&[&'a [u8]], usize) -> Option<&'a [u8]>,
) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    info.split(|&b| b == b'\n').rev().find_map(|line| {
        let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let sep = f.iter().position(|&x| x == b"-")?;
        (unescape_mountinfo(f.get(4)?) == want).then(|| {
            pick(&f, sep).map(|v| String::from_utf8_lossy(&unescape_mountinfo(v)).into_owned())
        })?
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, etc.).
fn unescape_mountinfo(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The mountpoint of a daemon that takes over a kept mount, resolved by the first daemon.
static RESOLVED_MOUNTPOINT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Records `mnt` as resolved: [`resolve_mountpoint`] gives it back without asking the file
/// system (a stat of a kept mount's root, before its new daemon serves, would wait on that
/// daemon).
pub fn set_resolved_mountpoint(mnt: PathBuf) {
    let _ = RESOLVED_MOUNTPOINT.set(mnt);
}

/// `mnt` canonical: as recorded by [`set_resolved_mountpoint`], else `std::fs::canonicalize`.
pub fn resolve_mountpoint(mnt: &Path) -> std::io::Result<PathBuf> {
    match RESOLVED_MOUNTPOINT.get() {
        Some(r) if r == mnt => Ok(r.clone()),
        _ => std::fs::canonicalize(mnt),
    }
}

/// The daemon's log when no `--log` is given: `loosefs/log/<mountpoint>.log` under
/// `$XDG_STATE_HOME` (default `~/.local/state`, else `/var/log`), the mountpoint's absolute
/// path with `/` as `_`.
pub fn default_log_path(mnt: &Path) -> PathBuf {
    let abs = resolve_mountpoint(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    let name = abs.to_string_lossy().trim_matches('/').replace('/', "_");
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("/var/log"));
    base.join("loosefs").join("log").join(format!(
        "{}.log",
        if name.is_empty() { "root" } else { &name }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_escapes_are_undone() {
        assert_eq!(
            unescape_mountinfo(br"loosefs:csi/rg\043acct\134x\040y"),
            b"loosefs:csi/rg#acct\\x y"
        );
        // Not an escape: kept as it is.
        assert_eq!(unescape_mountinfo(br"a\09b\"), br"a\09b\");
    }
}
