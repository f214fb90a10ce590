//! The daemon's log file, rotated by size while the daemon runs (file-rotate): past
//! [`LOG_ROTATE`] bytes the log becomes `<log>.1`, the one before `<log>.2`, and older ones are
//! removed, so a long run with `--debug` keeps at most three files of about that size.
//!
//! The logger (env_logger, set up by the command line) writes through [`LogSink`]: to the
//! standard error until [`rotate_into`] names a log file, then into that file. The daemon's
//! standard error is the same file (panics and libraries' own messages land there): after a
//! rotation it is pointed at the new file too.

use file_rotate::{ContentLimit, FileRotate, compression::Compression, suffix::AppendCount};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Size of a log file past which it is rotated, bytes.
pub const LOG_ROTATE: usize = 8 << 20;

/// Rotated files kept besides the live one (`<log>.1`, `<log>.2`).
const KEPT: usize = 2;

struct Rotating {
    file: FileRotate<AppendCount>,
    path: PathBuf,
    /// Whether the standard error is the log file too, and follows it across rotations.
    follow: bool,
    /// Bytes written since standard error was last checked to be the live file.
    since_check: usize,
    /// The size past which a file is rotated.
    limit: usize,
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
        r.since_check += buf.len();
        if r.follow && r.since_check >= r.limit / 8 {
            r.since_check = 0;
            follow_with_stderr(&r.path);
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

/// Points the standard error at `path` again when the file there is no longer the one it
/// writes to (a rotation renamed that one to `<log>.1`).
fn follow_with_stderr(path: &Path) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let live = std::fs::metadata(path).map(|m| (m.dev(), m.ino()));
    let err = identity(std::io::stderr().as_fd());
    if let (Ok(live), Some(err)) = (live, err)
        && live != err
        && let Ok(f) = std::fs::OpenOptions::new()
            .append(true)
            .mode(0o600)
            .open(path)
    {
        let _ = nix::unistd::dup2_stderr(&f);
    }
}

/// The file `fd`'s (device, inode).
fn identity(fd: std::os::fd::BorrowedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(fd).ok().map(|s| (s.st_dev, s.st_ino))
}

/// From now on, log records go to `path` (a regular file, normally already the daemon's
/// standard error, which then follows it), rotated by size as the module comment says; new
/// files are made 0600.
pub fn rotate_into(path: &Path) {
    rotate_past(path, LOG_ROTATE)
}

/// [`rotate_into`], rotating past `limit` bytes.
fn rotate_past(path: &Path, limit: usize) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let follow = std::fs::metadata(path)
        .is_ok_and(|m| identity(std::io::stderr().as_fd()) == Some((m.dev(), m.ino())));
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).create(true).append(true).mode(0o600);
    let file = FileRotate::new(
        path,
        AppendCount::new(KEPT),
        ContentLimit::BytesSurpassed(limit),
        Compression::None,
        Some(opts),
    );
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(Rotating {
        file,
        path: path.to_path_buf(),
        follow,
        since_check: 0,
        limit,
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
