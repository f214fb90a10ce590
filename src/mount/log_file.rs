//! The daemon's log file, rotated by size while the daemon runs: past [`LOG_ROTATE`] bytes the
//! log becomes `<log>.1`, the one before `<log>.2`, and the oldest is replaced, so a long run
//! with `--debug` keeps at most three files of about that size.
//!
//! The logger (env_logger, set up by the command line) writes through [`LogSink`]: to the
//! standard error until [`rotate_into`] names a log file, then into that file. The daemon's
//! standard error is the same file (panics and libraries' own messages land there): after a
//! rotation it is pointed at the new file too.
//!
//! Our own code, not the file-rotate crate: that crate lists the log's directory and stats
//! every entry of it at start and on each rotation, and a log kept beside the mountpoint (as
//! `--log MNT.log` is) then makes the daemon stat its own mount from the logging thread, which
//! waits forever whenever the serving threads are stopped; it also panics on a directory it
//! cannot read. The three renames here touch the log's own names only.

use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fstatat};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Size of a log file past which it is rotated, bytes.
pub const LOG_ROTATE: u64 = 8 << 20;

/// A log's directory, opened once, and the log's name in it: every later open, rename and
/// create is relative to that descriptor and follows no link, so a user who may write the
/// directory (a shared log directory, the system temp directory) can neither move it under the
/// daemon nor make the daemon (root, in a cluster's hooks) write through a link they plant at a
/// rotation.
pub(super) struct LogPlace {
    dir: OwnedFd,
    name: OsString,
    /// The path as given, for messages.
    path: PathBuf,
}

impl LogPlace {
    /// Opens the directory of `path`. Errors: it has no file name, or its directory cannot be
    /// opened.
    pub(super) fn new(path: &Path) -> std::io::Result<LogPlace> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = nix::fcntl::open(
            parent,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(LogPlace {
            dir,
            name: name.to_owned(),
            path: path.to_path_buf(),
        })
    }

    /// `<name>.N`.
    fn numbered(&self, n: u32) -> OsString {
        let mut p = self.name.clone();
        p.push(format!(".{n}"));
        p
    }

    fn exists(&self, name: &OsStr) -> bool {
        fstatat(self.dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// Opens the log for appending (made 0600 when new; with `fresh`, only a new file): never
    /// through a link (ELOOP), never a FIFO or socket (the open does not block; refused); a
    /// character device (`/dev/null`, a terminal) is taken as it is.
    fn open(&self, fresh: bool) -> std::io::Result<std::fs::File> {
        let mut flags = OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        if fresh {
            flags |= OFlag::O_EXCL;
        }
        let fd = openat(
            self.dir.as_fd(),
            self.name.as_os_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ELOOP => std::io::Error::other(format!(
                "{}: is a symbolic link (a log is never written through one)",
                self.path.display()
            )),
            e => std::io::Error::from(e),
        })?;
        // O_NONBLOCK was for the open only (a FIFO planted there must not block it).
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFL(OFlag::O_WRONLY | OFlag::O_APPEND),
        )?;
        let file = std::fs::File::from(fd);
        let kind = file.metadata()?.file_type();
        use std::os::unix::fs::FileTypeExt;
        if !(kind.is_file() || (!fresh && kind.is_char_device())) {
            return Err(std::io::Error::other(format!(
                "{}: not a regular file",
                self.path.display()
            )));
        }
        Ok(file)
    }

    /// Opens the log for appending (0600 when new), rotated first when it is already past
    /// [`LOG_ROTATE`]. Errors: the open failed, or the name is a link, a FIFO or a socket.
    pub(super) fn open_appending(&self) -> std::io::Result<std::fs::File> {
        let big = fstatat(
            self.dir.as_fd(),
            self.name.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|s| {
            (s.st_mode & libc::S_IFMT) == libc::S_IFREG && s.st_size as u64 > LOG_ROTATE
        });
        if big {
            return self.rotate();
        }
        self.open(false)
    }

    /// Shifts `<name>.1` to `<name>.2` (replacing it) and `<name>` to `<name>.1`, then creates
    /// a new `<name>` (0600, appending; a name planted in between is removed, never followed).
    /// Errors: the renames or the create failed.
    fn rotate(&self) -> std::io::Result<std::fs::File> {
        let (one, two) = (self.numbered(1), self.numbered(2));
        let d = self.dir.as_fd();
        if self.exists(&one) {
            renameat(d, one.as_os_str(), d, two.as_os_str())?;
        }
        renameat(d, self.name.as_os_str(), d, one.as_os_str())?;
        self.create_fresh()
    }

    /// Creates a new, empty log at the name, removing whatever was planted there since the
    /// rename (a link is unlinked, never followed), a few times over against a user who plants
    /// again. Errors: the name was taken at every try, or the create failed otherwise.
    fn create_fresh(&self) -> std::io::Result<std::fs::File> {
        let mut tries = 8;
        loop {
            match self.open(true) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && tries > 0 => {
                    tries -= 1;
                    let _ = nix::unistd::unlinkat(
                        self.dir.as_fd(),
                        self.name.as_os_str(),
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    );
                }
                r => return r,
            }
        }
    }
}

struct Rotating {
    file: std::fs::File,
    place: LogPlace,
    /// Bytes in the live file.
    size: u64,
    /// The size past which a file is rotated.
    limit: u64,
    /// Whether the standard error is the log file too, and follows it across rotations.
    follow: bool,
}

static SINK: Mutex<Option<Rotating>> = Mutex::new(None);

/// Where log records go: the rotated log file once [`rotate_into`] named one, else the
/// standard error. Give it to the logger (`env_logger::Target::Pipe`).
pub struct LogSink;

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = sink.as_mut() else {
            return std::io::stderr().write(buf);
        };
        r.file.write_all(buf)?;
        r.size += buf.len() as u64;
        if r.size > r.limit {
            // A log that cannot be rotated (a read-only directory) keeps growing rather than
            // losing messages.
            if let Ok(file) = r.place.rotate() {
                if r.follow {
                    let _ = nix::unistd::dup2_stderr(&file);
                }
                r.file = file;
                r.size = 0;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
        match sink.as_mut() {
            Some(r) => r.file.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

/// The file `fd`'s (device, inode).
fn identity(fd: std::os::fd::BorrowedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino))
}

/// From now on, log records go to `file` (the log at `place`, opened by
/// [`LogPlace::open_appending`], normally already the daemon's standard error, which then
/// follows it), rotated by size as the module comment says.
pub(super) fn rotate_into(place: LogPlace, file: std::fs::File) {
    rotate_past(place, file, LOG_ROTATE)
}

/// [`rotate_into`], rotating past `limit` bytes.
fn rotate_past(place: LogPlace, file: std::fs::File, limit: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return;
    };
    let follow = identity(std::io::stderr().as_fd()) == Some((meta.dev(), meta.ino()));
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(Rotating {
        file,
        place,
        size: meta.len(),
        limit,
        follow,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sink is one per process: its tests take turns.
    static TURN: Mutex<()> = Mutex::new(());

    #[test]
    fn a_log_past_its_limit_is_rotated_and_at_most_two_old_files_are_kept() {
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("daemon.log");
        std::fs::write(&log, b"").unwrap();
        // A directory beside the log (as a mountpoint beside `MNT.log`) is never looked at.
        std::fs::create_dir(d.path().join("mnt")).unwrap();
        let place = LogPlace::new(&log).unwrap();
        let file = place.open_appending().unwrap();
        rotate_past(place, file, 64 << 10);
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..(64 << 10) * 7 / 2 / line.len() {
            LogSink.write_all(line.as_bytes()).unwrap();
        }
        LogSink.flush().unwrap();
        *SINK.lock().unwrap() = None;
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "mnt")
            .collect();
        names.sort();
        assert_eq!(names, ["daemon.log", "daemon.log.1", "daemon.log.2"]);
        for n in &names {
            let len = std::fs::metadata(d.path().join(n)).unwrap().len();
            assert!(len <= (64 << 10) + line.len() as u64, "{n}: {len}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join("daemon.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A root-owned file another user would like the daemon to write (reliability-probe.md,
    /// log-rotate-symlink-race).
    fn victim(d: &Path) -> PathBuf {
        let v = d.join("victim");
        std::fs::write(&v, b"root's\n").unwrap();
        v
    }

    #[test]
    fn a_link_planted_as_the_log_is_never_written_through() {
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let log = d.path().join("daemon.log");
        std::os::unix::fs::symlink(&v, &log).unwrap();
        let e = LogPlace::new(&log).unwrap().open_appending().unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Planted between a rotation's rename and its create: removed, a new file made.
        let place = LogPlace::new(&log).unwrap();
        let mut f = place.create_fresh().unwrap();
        f.write_all(b"line\n").unwrap();
        assert!(!std::fs::symlink_metadata(&log).unwrap().is_symlink());
        assert_eq!(std::fs::read(&v).unwrap(), b"root's\n");
        // A FIFO planted as the log neither blocks the open nor is taken.
        let fifo = d.path().join("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(LogPlace::new(&fifo).unwrap().open_appending().is_err());
    }

    #[test]
    fn rotations_raced_by_a_planted_link_never_write_through_it() {
        // A user who may write the log's directory spins on planting a link at the log's name
        // while the daemon logs past its limit again and again.
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let d = tempfile::tempdir().unwrap();
        let v = victim(d.path());
        let log = d.path().join("daemon.log");
        let place = LogPlace::new(&log).unwrap();
        let file = place.open_appending().unwrap();
        rotate_past(place, file, 4 << 10);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let planter = {
            let (stop, v, log) = (stop.clone(), v.clone(), log.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::os::unix::fs::symlink(&v, &log);
                }
            })
        };
        let line = format!("{}\n", "y".repeat(127));
        for _ in 0..(4 << 10) * 400 / line.len() {
            LogSink.write_all(line.as_bytes()).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        planter.join().unwrap();
        *SINK.lock().unwrap() = None;
        assert_eq!(
            std::fs::read(&v).unwrap(),
            b"root's\n",
            "written through the link"
        );
    }
}
