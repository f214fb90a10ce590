//! The FUSE transports, translation only: requests in, [`Fs`] calls, replies (attributes
//! with their TTLs, bytes, errnos) out. No filesystem logic lives here. Two transports side by
//! side, both answering through the reply helpers of this file:
//! - `fuse/devfuse.rs`: [`LooseFs`], the fuser adaptor reading `/dev/fuse` (and the one that
//!   handles INIT, FORGET and the notifications on either transport);
//! - `fuse/uring.rs` with `fuse/uring/`: FUSE over io_uring, ring entries answered with the
//!   same [`Fs`].
//!
//! Kernel settings chosen in `init` and in replies: `FUSE_PARALLEL_DIROPS` (no per-directory
//! lock on lookups), READDIRPLUS on every listing, negative lookups answered as inode-0
//! entries so the kernel caches them, zero-message open/opendir/flush (ENOSYS once: no
//! OPEN/RELEASE round trips, page cache and listings kept across opens), a quiet ENOTTY for the
//! `isatty` ioctl Python sends on every `open()`, and `max_write` left at its default so reads
//! can be up to `max_pages` (1 MiB, the ring's payload buffer, when FUSE over io_uring is
//! asked for). `docs/DESIGN.md` gives the measurements behind each.

use crate::catalog::{Attr, FsError, Kind};
use crate::fs::Fs;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod backing;
mod devfuse;
pub mod notify;
pub mod takeover;
pub mod uring;

pub use devfuse::LooseFs;

/// The errno a failed `op` on `ino` answers, logged at debug level (whoever found the error
/// has logged it once already). Both transports answer through it.
fn failed(server: &Fs, op: &str, ino: u64, e: &FsError) -> Errno {
    log::debug!("{op} {}: {e}", server.path_of(ino));
    errno(e)
}

/// `server.read` with `reply` (both transports): a panic anywhere below fails this request
/// only (the reply, dropped while unwinding, answers EIO) and is logged; the thread keeps
/// serving. A failed read is logged at debug level with its path (`mount --debug`). Returns
/// false after a panic.
fn read_guarded(
    server: &Fs,
    ino: u64,
    offset: u64,
    size: u32,
    reply: impl FnOnce(Result<&[u8], FsError>) + Send + 'static,
) -> bool {
    hold_for_a_test();
    // The path is looked up only when debug messages are kept.
    let path = log::log_enabled!(log::Level::Debug).then(|| server.path_of(ino));
    let reply = move |r: Result<&[u8], FsError>| {
        if let (Err(e), Some(path)) = (&r, &path) {
            log::debug!("read {path} at byte {offset}: {e}");
        }
        reply(r)
    };
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        server.read(ino, offset, size, reply)
    }));
    if let Err(p) = &served {
        log::error!(
            "{}: a read at byte {offset} failed ({}); answering EIO",
            server.path_of(ino),
            crate::stats::panic_message(&**p)
        );
    }
    served.is_ok()
}

/// Test hook (`LOOSEFS_TEST_HOLD_READ=FILE`): while FILE exists, the next READ renames it to
/// `FILE.held` and then never returns, so a test can kill the daemon with a READ in flight
/// inside it. Without the variable, one relaxed load.
fn hold_for_a_test() {
    static HOLD: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let Some(f) = HOLD.get_or_init(|| std::env::var_os("LOOSEFS_TEST_HOLD_READ").map(Into::into))
    else {
        return;
    };
    let mut held = f.clone().into_os_string();
    held.push(".held");
    if std::fs::rename(f, &held).is_ok() {
        log::warn!("test hook: holding a READ until this daemon is killed");
        loop {
            std::thread::park();
        }
    }
}

/// The attributes the kernel is given for `a`: every time is the modification time, files
/// owned by `uid`/`gid`.
fn file_attr(a: &Attr, uid: u32, gid: u32) -> FileAttr {
    let mtime = if a.mtime_sec >= 0 {
        UNIX_EPOCH + Duration::new(a.mtime_sec as u64, a.mtime_nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(a.mtime_sec.unsigned_abs())
    };
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid,
        gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The errno for `e`. Whoever found the error has logged it (once); the adaptor only maps it.
fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::NotDir => Errno::ENOTDIR,
        FsError::IsDir => Errno::EISDIR,
        FsError::Corrupt(_) | FsError::Io(_) | FsError::Internal(_) => Errno::EIO,
        FsError::Stale(_) => Errno::ESTALE,
        FsError::Denied => Errno::EACCES,
        FsError::ReadOnly => Errno::EROFS,
        FsError::Invalid(_) => Errno::EINVAL,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

/// Attributes of a cached negative entry (inode 0).
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}
