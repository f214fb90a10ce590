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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Size of a log file past which it is rotated, bytes.
pub const LOG_ROTATE: u64 = 8 << 20;

struct Rotating {
    file: std::fs::File,
    path: PathBuf,
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
            if let Ok(file) = rotate(&r.path) {
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

/// `<path>.N`.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{n}"));
    PathBuf::from(p)
}

/// Shifts `<path>.1` to `<path>.2` (replacing it) and `<path>` to `<path>.1`, then opens a new
/// `<path>` (0600, appending). Errors: the renames or the open failed.
pub(super) fn rotate(path: &Path) -> std::io::Result<std::fs::File> {
    let one = numbered(path, 1);
    if one.exists() {
        std::fs::rename(&one, numbered(path, 2))?;
    }
    std::fs::rename(path, &one)?;
    open(path)
}

/// Opens `path` for appending, made 0600 when new.
fn open(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The file `fd`'s (device, inode).
fn identity(fd: std::os::fd::BorrowedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino))
}

/// From now on, log records go to `path` (a regular file, normally already the daemon's
/// standard error, which then follows it), rotated by size as the module comment says.
pub fn rotate_into(path: &Path) {
    rotate_past(path, LOG_ROTATE)
}

/// [`rotate_into`], rotating past `limit` bytes.
fn rotate_past(path: &Path, limit: u64) {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(file) = open(path) else {
        return;
    };
    let Ok(meta) = file.metadata() else {
        return;
    };
    let follow = identity(std::io::stderr().as_fd()) == Some((meta.dev(), meta.ino()));
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(Rotating {
        file,
        path: path.to_path_buf(),
        size: meta.len(),
        limit,
        follow,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_past_its_limit_is_rotated_and_at_most_two_old_files_are_kept() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("daemon.log");
        std::fs::write(&log, b"").unwrap();
        // A directory beside the log (as a mountpoint beside `MNT.log`) is never looked at.
        std::fs::create_dir(d.path().join("mnt")).unwrap();
        rotate_past(&log, 64 << 10);
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
}
