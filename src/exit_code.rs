//! Exit codes by kind of failure, chosen where the error is understood and read once at the
//! process's edge (`main`, and the CSI node plugin for a daemon that ended before serving).
//! The codes above 2 are BSD's `sysexits.h` (also Python's `os.EX_*`):
//!
//! | code | kind | when |
//! |---|---|---|
//! | 0 | | done |
//! | 1 | [`ExitKind::Failed`] | failed, of no kind below (also: `verify` found a difference, `csi-mounter --check` found no mounter) |
//! | 2 | [`ExitKind::Usage`] | the command line, an option, a `LOOSEFS_*` variable or an fstab option refused (clap's code) |
//! | 3 | | a kept mount's new daemon found other files than the mount's, so the mount ends (between a daemon and its keeper) |
//! | 65 `EX_DATAERR` | [`ExitKind::Damaged`] | the source is damaged (a checksum, a truncated file) or in no format loosefs reads |
//! | 66 `EX_NOINPUT` | [`ExitKind::NotFound`] | the source (file, directory, object, bucket, container) does not exist |
//! | 69 `EX_UNAVAILABLE` | [`ExitKind::Unavailable`] | a server cannot be reached, keeps failing or answers wrongly; a kernel feature asked for is off |
//! | 75 `EX_TEMPFAIL` | [`ExitKind::Changed`] | the source changed while it was read (an object replaced, a stale shared index): run it again |
//! | 77 `EX_NOPERM` | [`ExitKind::Denied`] | permission denied: a file's mode, `/dev/fuse`, credentials refused |
//!
//! How a failure gets its kind ([`ExitKind::of`]): a kind given explicitly where the failure is
//! decided ([`refuse`], [`with_kind`]) wins, the outermost first; else the innermost error
//! whose type says it: an [`ObjectError`], an `io::Error`'s kind, a damaged pack
//! ([`FormatError`]); else [`ExitKind::Failed`].

use crate::pack::FormatError;
use crate::storage::object::source::ObjectError;
use std::io::ErrorKind as Io;

/// What kind of failure ended a command; its [`ExitKind::code`] is the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// Failed, of no kind below: 1.
    Failed,
    /// Bad usage: 2.
    Usage,
    /// The source is damaged or in no known format: 65 (`EX_DATAERR`).
    Damaged,
    /// The source does not exist: 66 (`EX_NOINPUT`).
    NotFound,
    /// A server or kernel feature is not available: 69 (`EX_UNAVAILABLE`).
    Unavailable,
    /// The source changed while it was read: 75 (`EX_TEMPFAIL`).
    Changed,
    /// Permission denied: 77 (`EX_NOPERM`).
    Denied,
}

impl ExitKind {
    /// Every kind, in the table's order.
    pub const ALL: [ExitKind; 7] = [
        ExitKind::Failed,
        ExitKind::Usage,
        ExitKind::Damaged,
        ExitKind::NotFound,
        ExitKind::Unavailable,
        ExitKind::Changed,
        ExitKind::Denied,
    ];

    /// The exit code (see the module's table).
    pub const fn code(self) -> i32 {
        match self {
            ExitKind::Failed => 1,
            ExitKind::Usage => 2,
            ExitKind::Damaged => 65,
            ExitKind::NotFound => 66,
            ExitKind::Unavailable => 69,
            ExitKind::Changed => 75,
            ExitKind::Denied => 77,
        }
    }

    /// The kind an exit code says, if it is one of the table's.
    pub fn of_code(code: i32) -> Option<ExitKind> {
        ExitKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The kind of failure `e` is (see the module's doc for the order).
    pub fn of(e: &anyhow::Error) -> ExitKind {
        if let Some(k) = e.chain().find_map(|c| c.downcast_ref::<Kinded>()) {
            return k.kind;
        }
        let causes: Vec<_> = e.chain().collect();
        causes
            .iter()
            .rev()
            .find_map(|c| of_typed(*c))
            .unwrap_or(ExitKind::Failed)
    }
}

/// The kind a typed error says, if its type says one.
fn of_typed(e: &(dyn std::error::Error + 'static)) -> Option<ExitKind> {
    if let Some(o) = e.downcast_ref::<ObjectError>() {
        return Some(of_object(o));
    }
    if let Some(f) = e.downcast_ref::<FormatError>() {
        return match f {
            FormatError::Io(io) => of_io(io),
            _ => Some(ExitKind::Damaged),
        };
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return of_io(io);
    }
    None
}

fn of_object(o: &ObjectError) -> ExitKind {
    match o {
        ObjectError::Replaced { .. } => ExitKind::Changed,
        ObjectError::Denied { .. } => ExitKind::Denied,
        ObjectError::BadAnswer { .. } | ObjectError::Network { .. } => ExitKind::Unavailable,
    }
}

fn of_io(e: &std::io::Error) -> Option<ExitKind> {
    if let Some(o) = e.get_ref().and_then(|i| i.downcast_ref::<ObjectError>()) {
        return Some(of_object(o));
    }
    Some(match e.kind() {
        Io::NotFound => ExitKind::NotFound,
        Io::PermissionDenied | Io::ReadOnlyFilesystem => ExitKind::Denied,
        Io::StaleNetworkFileHandle => ExitKind::Changed,
        Io::InvalidData | Io::UnexpectedEof => ExitKind::Damaged,
        Io::ConnectionRefused
        | Io::ConnectionReset
        | Io::ConnectionAborted
        | Io::NotConnected
        | Io::TimedOut
        | Io::HostUnreachable
        | Io::NetworkUnreachable
        | Io::NetworkDown
        | Io::AddrNotAvailable => ExitKind::Unavailable,
        _ => return None,
    })
}

/// An error given its kind where it was understood: shows as the error it wraps.
#[derive(Debug)]
struct Kinded {
    kind: ExitKind,
    inner: anyhow::Error,
}

impl std::fmt::Display for Kinded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.inner, f)
    }
}

impl std::error::Error for Kinded {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// A failure of `kind` saying `message`.
pub fn refuse(kind: ExitKind, message: impl std::fmt::Display) -> anyhow::Error {
    with_kind(anyhow::anyhow!("{message}"), kind)
}

/// What reading a source's structure (a format's scan, a zip's members) refused: the source's
/// data is damaged, a file it names that is missing included. Only a source `src` that is not
/// there, a file the user may not read, or a usage refusal keep their kind.
pub fn as_damaged(e: anyhow::Error, src: &std::path::Path) -> anyhow::Error {
    match ExitKind::of(&e) {
        ExitKind::NotFound if std::fs::symlink_metadata(src).is_err() => e,
        ExitKind::Denied | ExitKind::Usage => e,
        _ => with_kind(e, ExitKind::Damaged),
    }
}

/// `e`'s message (its causes on one line) followed by `rest` (what the other ways tried said),
/// as one failure of `e`'s kind: the last way tried says why the command failed.
pub fn joined(e: anyhow::Error, rest: impl std::fmt::Display) -> anyhow::Error {
    let kind = ExitKind::of(&e);
    with_kind(anyhow::anyhow!("{e:#}{rest}"), kind)
}

/// `e` as a failure of `kind`, its message and causes unchanged.
pub fn with_kind(e: anyhow::Error, kind: ExitKind) -> anyhow::Error {
    anyhow::Error::new(Kinded { kind, inner: e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_one_kinds_and_read_back() {
        let codes: Vec<i32> = ExitKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes, [1, 2, 65, 66, 69, 75, 77]);
        for k in ExitKind::ALL {
            assert_eq!(ExitKind::of_code(k.code()), Some(k));
        }
        assert_eq!(ExitKind::of_code(3), None);
        assert_eq!(ExitKind::of_code(101), None);
    }

    #[test]
    fn a_failure_is_kinded_by_what_understood_it() {
        let io = |k| anyhow::Error::new(std::io::Error::new(k, "x")).context("cannot open /d");
        assert_eq!(ExitKind::of(&io(Io::NotFound)), ExitKind::NotFound);
        assert_eq!(ExitKind::of(&io(Io::PermissionDenied)), ExitKind::Denied);
        assert_eq!(
            ExitKind::of(&io(Io::ConnectionRefused)),
            ExitKind::Unavailable
        );
        assert_eq!(ExitKind::of(&io(Io::Other)), ExitKind::Failed);
        assert_eq!(ExitKind::of(&anyhow::anyhow!("no kind")), ExitKind::Failed);
        // An object error inside an io::Error (as the read path carries it).
        let replaced = ObjectError::Replaced {
            url: "s3://b/k".into(),
            etag: "\"1\"".into(),
            why: "412".into(),
        };
        let e = anyhow::Error::new(std::io::Error::from(replaced)).context("cannot read");
        assert_eq!(ExitKind::of(&e), ExitKind::Changed);
        // A damaged pack, through its typed error.
        let e = anyhow::Error::new(FormatError::Truncated("index".into())).context("cannot open");
        assert_eq!(ExitKind::of(&e), ExitKind::Damaged);
        // An explicit kind wins over what is inside, and changes no word of the message.
        let inner = io(Io::NotFound);
        let text = format!("{inner:#}");
        let e = with_kind(inner, ExitKind::Usage);
        assert_eq!(ExitKind::of(&e), ExitKind::Usage);
        assert_eq!(format!("{e:#}"), text);
        let e = refuse(ExitKind::Damaged, "bad").context("cannot mount /d");
        assert_eq!(ExitKind::of(&e), ExitKind::Damaged);
        assert_eq!(format!("{e:#}"), "cannot mount /d: bad");
    }
}
