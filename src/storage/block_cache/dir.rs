//! The directory of one object's block cache: where it is (`<root>/<xxh3(url)>-<xxh3(etag,
//! version)>`), its exclusive lock, and the opening of its files. A cache root may be shared
//! (node-local scratch), and the directory names are predictable, so nothing here follows a
//! link: the root must be owned by the user and writable by nobody else, the object directory
//! is opened with `O_NOFOLLOW | O_DIRECTORY` and its files relative to that handle with
//! `O_NOFOLLOW`; directories are made 0700 and files 0600 (a credentials-protected pack is not
//! readable from the cache by other users).

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The default block cache: `blocks/` under [`crate::storage::cache_root`]
/// (`$LOOSEFS_CACHE_DIR`, else `$XDG_CACHE_HOME/loosefs`, else `~/.cache/loosefs`).
pub fn default_root() -> PathBuf {
    crate::storage::cache_root().join("blocks")
}

/// The start of the name of every cache directory of `url`, whatever its version:
/// `<xxh3(url)>-`.
pub fn url_prefix(url: &str) -> String {
    format!("{:016x}-", xxhash_rust::xxh3::xxh3_64(url.as_bytes()))
}

/// The cache directory of an object: `<root>/<xxh3(url)>-<xxh3(etag, version)>`.
pub fn cache_dir(root: &Path, url: &str, etag: &str, version: Option<&str>) -> PathBuf {
    let v = format!("{etag}\0{}", version.unwrap_or(""));
    root.join(format!(
        "{}{:016x}",
        url_prefix(url),
        xxhash_rust::xxh3::xxh3_64(v.as_bytes())
    ))
}

/// Makes the cache root `root` (0700) if missing and checks that no other user can plant
/// entries in it. Errors: it cannot be made, is not a directory (a link to one included), is
/// not owned by this user, or is writable by group or others (with the command that fixes it).
pub fn check_root(root: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    let m = std::fs::symlink_metadata(root)?;
    let me = nix::unistd::geteuid().as_raw();
    let why = if !m.file_type().is_dir() {
        Some("is not a directory (a symbolic link is refused)".to_string())
    } else if m.uid() != me {
        Some(format!(
            "belongs to uid {}, not to this user ({me})",
            m.uid()
        ))
    } else if m.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by other users (mode {:o}): another user could plant links in it; `chmod go-w {}` or give another --cache-dir",
            m.mode() & 0o7777,
            root.display()
        ))
    } else {
        None
    };
    match why {
        Some(w) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the cache root {} {w}", root.display()),
        )),
        None => Ok(()),
    }
}

/// One object's cache directory, opened without following links and locked for the life of
/// a mount.
#[derive(Debug)]
pub struct CacheDir {
    path: PathBuf,
    fd: OwnedFd,
    /// The exclusive lock, released when the directory is dropped.
    _lock: nix::fcntl::Flock<File>,
}

impl CacheDir {
    /// Makes (0700) and locks the directory `path` inside the checked root, and removes temp
    /// files a killed writer left. Errors: the directory cannot be made or opened, is a link
    /// or not this user's, or another mount holds it (after waiting 10 s for one that is
    /// exiting).
    pub fn lock(path: &Path) -> io::Result<CacheDir> {
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: cannot open the cache directory without following links ({e})",
                    path.display()
                ),
            )
        })?;
        let dir = File::from(fd);
        let m = dir.metadata()?;
        if m.uid() != nix::unistd::geteuid().as_raw() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: the cache directory is not this user's", path.display()),
            ));
        }
        if m.mode() & 0o077 != 0 {
            dir.set_permissions(std::fs::Permissions::from_mode(0o700))?;
        }
        let fd = OwnedFd::from(dir);
        let lock = wait_lock(File::from(open_at(&fd, "lock", false)?), path)?;
        // Temp files of a writer killed mid-way (a crash).
        for e in std::fs::read_dir(path)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(CacheDir {
            path: path.to_path_buf(),
            fd,
            _lock: lock,
        })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (creating, 0600) the file `name` in the directory, read-write, never through a
    /// link. Errors: `name` is a link (ELOOP) or cannot be opened.
    pub fn open_rw(&self, name: &str) -> io::Result<File> {
        let f = File::from(open_at(&self.fd, name, false)?);
        if f.metadata()?.mode() & 0o077 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(f)
    }

    /// Opens the existing file `name` read-only, never through a link.
    pub fn open_ro(&self, name: &str) -> io::Result<File> {
        Ok(File::from(open_at(&self.fd, name, true)?))
    }

    /// Whether `name` exists in the directory (a link counts as existing).
    pub fn has(&self, name: &str) -> bool {
        nix::sys::stat::fstatat(
            self.fd.as_fd(),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok()
    }

    /// Removes the file `name` (a link is removed, not followed).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        nix::unistd::unlinkat(
            self.fd.as_fd(),
            name,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(io::Error::from)
    }

    /// Makes the directory's entries durable.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(self.fd.as_fd()).map_err(io::Error::from)
    }
}

fn open_at(dir: &OwnedFd, name: &str, read_only: bool) -> io::Result<OwnedFd> {
    let flags = if read_only {
        OFlag::O_RDONLY
    } else {
        OFlag::O_RDWR | OFlag::O_CREAT
    };
    openat(
        dir.as_fd(),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| {
        let why = if e == nix::errno::Errno::ELOOP {
            "it is a symbolic link, which the cache never follows".to_string()
        } else {
            e.desc().to_string()
        };
        io::Error::new(
            io::Error::from(e).kind(),
            format!("cannot open {name}: {why}"),
        )
    })
}

/// Takes the exclusive lock on `lock`; a mount of the same object that was just unmounted may
/// still be exiting, so it waits up to 10 s.
fn wait_lock(mut lock: File, dir: &Path) -> io::Result<nix::fcntl::Flock<File>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((_, e)) if std::time::Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "the block cache {} is in use by another mount ({e}); give another --cache-dir",
                        dir.display()
                    ),
                ));
            }
            Err((f, _)) => {
                lock = f;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_links_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        check_root(&root).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let d = root.join("obj");
        std::fs::create_dir(&d).unwrap();
        for name in ["lock", "data"] {
            std::os::unix::fs::symlink(&victim, d.join(name)).unwrap();
        }
        // The lock file is a link: the directory is refused, the target untouched.
        let e = CacheDir::lock(&d).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_file(d.join("lock")).unwrap();
        let c = CacheDir::lock(&d).unwrap();
        let e = c.open_rw("data").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // The object directory itself a link to another directory: refused.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("obj2")).unwrap();
        assert!(CacheDir::lock(&root.join("obj2")).is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn cache_files_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("r");
        check_root(&root).unwrap();
        let d = root.join("o");
        let c = CacheDir::lock(&d).unwrap();
        let f = c.open_rw("data").unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_root_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("shared");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_root(&root).unwrap_err();
        assert!(e.to_string().contains("writable by other users"), "{e}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        let e = check_root(&link).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn one_mount_holds_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("o");
        let _c = CacheDir::lock(&d).unwrap();
        // A second lock from this process (another open file description) waits 10 s and is
        // refused: flock locks are per open file description.
        let e = CacheDir::lock(&d).unwrap_err();
        assert!(e.to_string().contains("in use by another mount"), "{e}");
    }
}
