//! What a daemon is handed when it serves a kept mount, and how: the variables a keeper sets
//! for the daemons it starts ([`Kept`]: the connection on fd 3, the kernel's INIT offer, resend
//! or not, the resolved mountpoint, the log, the first daemon's catalog fingerprint; the
//! keeper's pid, restarts and the last daemon's end for `stats`), the pipe on which a
//! handed-over connection's first daemon tells its keeper the offer line, and the offer line
//! a CSI mounter is given to take a connection over ([`taken_over_env`]).

use crate::fuse::takeover::{self, InitOffer};
use anyhow::{Context, Result, bail};
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// A daemon started by a keeper: the connection's descriptor number.
pub(super) const KEPT_FD_ENV: &str = "LOOSEFS_KEPT_FD";
/// A daemon started by a keeper: the kernel's INIT offer ([`InitOffer`]'s text).
pub(super) const KEPT_INIT_ENV: &str = "LOOSEFS_KEPT_INIT";
/// A daemon started by a keeper: whether its unanswered requests are resent (`1`/`0`).
pub(super) const KEPT_RESEND_ENV: &str = "LOOSEFS_KEPT_RESEND";
/// The keeper's pid, for `stats` and `loosefs restart`.
pub(super) const KEEPER_PID_ENV: &str = "LOOSEFS_KEEPER_PID";
/// How many daemons the keeper started after the first.
pub(super) const RESTARTS_ENV: &str = "LOOSEFS_KEEPER_RESTARTS";
/// How the daemon before this one ended.
pub(super) const LAST_ENV: &str = "LOOSEFS_KEEPER_LAST";
/// A daemon started by a keeper: the mountpoint, resolved by the first daemon (resolving it
/// again would ask the very mount this daemon is to serve).
pub(super) const KEPT_MOUNTPOINT_ENV: &str = "LOOSEFS_KEPT_MOUNTPOINT";
/// A daemon started by a keeper: the log to point its stderr at (unset: the keeper's stderr).
pub(super) const KEPT_LOG_ENV: &str = "LOOSEFS_KEPT_LOG";
/// A daemon started by a keeper: the fingerprint of the first daemon's catalog (hex).
pub(super) const KEPT_CATALOG_ENV: &str = "LOOSEFS_KEPT_CATALOG";
/// Test hook: a daemon started by a keeper exits at once, with an error, while this file
/// exists (a crash loop on demand).
pub(super) const FAIL_START_ENV: &str = "LOOSEFS_TEST_FAIL_START_IF";

/// What a daemon started by a keeper was handed: the connection and the kernel's offer.
pub(crate) struct Kept {
    /// The connection, its offer, and which device this daemon reads.
    pub conn: takeover::Takeover,
    /// The mountpoint, resolved.
    pub mountpoint: PathBuf,
    /// The log this daemon's stderr goes to (`None`: the keeper's stderr).
    pub log: Option<PathBuf>,
    /// The first daemon's [`fingerprint`].
    pub catalog: u32,
}

impl Kept {
    /// The connection this process was handed by a keeper, `None` when it was not started by
    /// one. Clears the variables, so nothing this daemon starts inherits them.
    ///
    /// Errors: the variables are set but wrong (no such descriptor, not an offer).
    pub(crate) fn from_env() -> Result<Option<Kept>> {
        let Some(fd) = std::env::var_os(KEPT_FD_ENV) else {
            return Ok(None);
        };
        let fd: RawFd = (fd.to_str().and_then(|s| s.parse().ok()))
            .with_context(|| format!("{KEPT_FD_ENV}={fd:?} is not a descriptor number"))?;
        let offer = std::env::var(KEPT_INIT_ENV).unwrap_or_default();
        let offer = InitOffer::parse(&offer).context(KEPT_INIT_ENV)?;
        let resend = std::env::var(KEPT_RESEND_ENV).is_ok_and(|v| v == "1");
        let mountpoint = std::env::var_os(KEPT_MOUNTPOINT_ENV)
            .map(PathBuf::from)
            .with_context(|| format!("{KEPT_MOUNTPOINT_ENV} is not set"))?;
        let log = std::env::var_os(KEPT_LOG_ENV).map(PathBuf::from);
        let catalog = (std::env::var(KEPT_CATALOG_ENV).ok())
            .and_then(|v| u32::from_str_radix(&v, 16).ok())
            .with_context(|| format!("{KEPT_CATALOG_ENV} is not a fingerprint"))?;
        if let Some(f) = std::env::var_os(FAIL_START_ENV)
            && Path::new(&f).exists()
        {
            bail!(
                "test hook: {FAIL_START_ENV} ({}) exists",
                Path::new(&f).display()
            );
        }
        // SAFETY: the keeper handed this descriptor to this process, and nothing else here
        // owns it; clearing the variable below makes sure it is taken once.
        let dev = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: called at the start of the daemon, before it starts any thread.
        unsafe {
            std::env::remove_var(KEPT_FD_ENV);
            std::env::remove_var(KEPT_INIT_ENV);
            std::env::remove_var(KEPT_RESEND_ENV);
            std::env::remove_var(KEPT_MOUNTPOINT_ENV);
            std::env::remove_var(KEPT_LOG_ENV);
            std::env::remove_var(KEPT_CATALOG_ENV);
        }
        Ok(Some(Kept {
            conn: takeover::Takeover { dev, offer, resend },
            mountpoint,
            log,
            catalog,
        }))
    }
}

/// The `daemon.keeper` section of `stats`, from the keeper's variables (`None` without one).
pub fn report() -> Option<crate::report::KeeperReport> {
    let pid = std::env::var(KEEPER_PID_ENV).ok()?.parse().ok()?;
    Some(crate::report::KeeperReport {
        pid,
        restarts: std::env::var(RESTARTS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        last_end: std::env::var(LAST_ENV).unwrap_or_default(),
    })
}

/// A first daemon started by [`keep_handed`]: the descriptor it writes its offer line to.
pub(super) const FIRST_OF_ENV: &str = "LOOSEFS_KEEPER_FIRST_FD";

/// Whoever started a handed-over connection's keeper (the CSI mounter) may ask for its offer
/// line (`OFFER RESEND CATALOG`) on this descriptor, to start a keeper for the same
/// connection later ([`keep_taken_over`]).
pub const INFO_FD_ENV: &str = "LOOSEFS_KEEPER_INFO_FD";

/// The descriptor of [`INFO_FD_ENV`], taken once.
pub(super) fn info_fd() -> Option<OwnedFd> {
    pipe_named_by(INFO_FD_ENV)
}

/// The pipe end whose descriptor number variable `var` names, taken once: the variable is
/// cleared and the descriptor made close-on-exec (nothing this process starts inherits it).
/// `None` without the variable, or when that descriptor is not a pipe.
fn pipe_named_by(var: &str) -> Option<OwnedFd> {
    let fd: RawFd = std::env::var(var).ok()?.parse().ok()?;
    // SAFETY: called at the process's start, before it starts any thread.
    unsafe { std::env::remove_var(var) };
    crate::mount::handover::set_cloexec(fd);
    crate::mount::handover::is_pipe(fd).then(|| {
        // SAFETY: whoever started this process passed this pipe's end to it, and nothing else
        // here owns it.
        unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
    })
}

/// The variables that hand a kept connection (on fd 3) to `loosefs mount SOURCE /dev/fd/3
/// --foreground --keeper`: its offer line as [`INFO_FD_ENV`] gave it. That process becomes
/// the connection's keeper again ([`keep_taken_over`]).
///
/// Errors: `line` is not an offer line.
pub fn taken_over_env(line: &str) -> Result<Vec<(&'static str, String)>> {
    let mut it = line.split_whitespace();
    let (Some(offer), Some(resend), Some(catalog), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        bail!("{line:?} is not a keeper's offer line (OFFER RESEND CATALOG)");
    };
    InitOffer::parse(offer)?;
    u32::from_str_radix(catalog, 16)
        .with_context(|| format!("{catalog:?} is not a fingerprint"))?;
    Ok(vec![
        (KEPT_FD_ENV, super::KEPT_FD.to_string()),
        (KEPT_INIT_ENV, offer.to_string()),
        (
            KEPT_RESEND_ENV,
            if resend == "1" { "1" } else { "0" }.to_string(),
        ),
        (KEPT_CATALOG_ENV, catalog.to_string()),
        (KEPT_MOUNTPOINT_ENV, format!("/dev/fd/{}", super::KEPT_FD)),
    ])
}

/// Whether this process was started by a keeper (a daemon it serves for), as opposed to
/// handed a kept connection by someone else ([`taken_over_env`]).
pub(crate) fn under_a_keeper() -> bool {
    std::env::var_os(KEEPER_PID_ENV).is_some()
}

/// In the first daemon of [`keep_handed`]: the descriptor to say the offer line on (`None`
/// elsewhere). Clears the variable.
pub(crate) fn first_of_handed() -> Option<OwnedFd> {
    pipe_named_by(FIRST_OF_ENV)
}

/// Tells [`keep_handed`] that this first daemon serves: `OFFER RESEND CATALOG`.
pub(crate) fn tell_handed_keeper(to: OwnedFd, offer: InitOffer, resend: bool, catalog: u32) {
    use std::io::Write;
    let line = format!("{offer} {} {catalog:08x}\n", u8::from(resend));
    let _ = std::fs::File::from(to).write_all(line.as_bytes());
}
