//! The mounter: the unprivileged half of the CSI driver (`loosefs csi-mounter`), and the
//! protocol the node plugin speaks to it.
//!
//! The node plugin (root) mounts `/dev/fuse` at a pod's target path, connects to the mounter's
//! Unix socket and sends, on one connection:
//! 1. the descriptor (SCM_RIGHTS, with a one-byte message);
//! 2. one JSON line, a [`Request`]: the volume, its source, the `loosefs mount` options, and the
//!    volume's directory (made by the plugin, owned by the mounter's user) for the daemon's
//!    caches and log.
//!
//! The mounter answers with JSON lines ([`Event`]): `started` (the daemon's pid in the
//! mounter's pid namespace), then `exited` with its exit code and the last lines it wrote, when
//! it ends. The daemon is `loosefs mount SOURCE /dev/fd/3 --foreground …` run as the mounter's
//! own user, with no capability (the mounter refuses to run as root). It ends when the target
//! is unmounted (its connection closes), or on its own when it cannot serve the source.
//!
//! The daemons are children of the mounter, not of the node plugin: a restarted node plugin
//! (a crash, an upgrade of its container) leaves every volume serving.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// What the node plugin asks the mounter to serve (one JSON line after the descriptor).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The CSI volume id (a PersistentVolume's `volumeHandle`), for logs.
    pub volume_id: String,
    /// Any source `loosefs mount` takes: a path on the node, or a URL.
    pub source: String,
    /// `loosefs mount` options (`--decode`, `npy`, `--warm`, …), already checked.
    pub args: Vec<String>,
    /// The volume's directory, owned by the mounter's user: the daemon's log (`daemon.log`)
    /// and standard error go there, and its caches (`cache/`, `index/`) unless `cache` is given.
    pub dir: PathBuf,
    /// The volume's cache directory, owned by the mounter's user, kept across stages: the
    /// daemon's `cache/` and `index/` go there.
    #[serde(default)]
    pub cache: Option<PathBuf>,
    /// The volume's own credentials, set in its daemon's environment alone
    /// ([`super::secrets`]).
    #[serde(default)]
    pub secrets: super::secrets::Secrets,
    /// A connection served before, by a mounter that ended: its keeper's offer line (the
    /// [`Event::Kept`] the first mounter sent). The daemon takes it over instead of waiting
    /// for a FUSE_INIT.
    #[serde(default)]
    pub kept: Option<String>,
}

/// What the mounter tells the node plugin about the daemon it started (JSON lines).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The daemon runs, with this pid (in the mounter's pid namespace).
    Started {
        /// Its process id.
        pid: u32,
    },
    /// The volume's keeper serves: its offer line (`OFFER RESEND CATALOG`), which the node
    /// plugin keeps with its copy of the connection to hand both to a restarted mounter.
    Kept {
        /// The line.
        line: String,
    },
    /// The daemon ended.
    Exited {
        /// Its exit code (128 + the signal that ended it).
        code: i32,
        /// The last lines of its log and standard error: why, when it failed.
        tail: String,
    },
}

/// `loosefs csi-mounter --socket PATH`: listens at `socket` (a stale socket file there is
/// replaced; the socket is made 0600) and serves every connection from root or its own user
/// as the module comment says, a thread each, until it is killed.
///
/// Errors: run as root (the daemons must not be), the socket cannot be made.
pub fn run(socket: &Path) -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        bail!(
            "loosefs csi-mounter runs every volume's daemon with its own user and no \
             privilege: run it as a user other than root (its container's runAsUser)"
        );
    }
    super::replace_stale_socket(socket)?;
    let listener = super::bind_private(socket, |p| UnixListener::bind(p))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} 0600", socket.display()))?;
    }
    crate::eprintln_lossy!(
        "loosefs csi-mounter: listening at {} as uid {}",
        socket.display(),
        nix::unistd::getuid()
    );
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                log::warn!("cannot accept at {}: {e}", socket.display());
                continue;
            }
        };
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            if let Err(e) = serve_one(conn, &socket) {
                crate::eprintln_lossy!("loosefs csi-mounter: {e:#}");
            }
        });
    }
    Ok(())
}

/// One request: takes the descriptor and the request, starts the daemon, reports `started`,
/// waits for it and reports `exited`.
fn serve_one(conn: UnixStream, socket: &Path) -> Result<()> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let peer = getsockopt(&conn, PeerCredentials).context("cannot read the peer's credentials")?;
    let me = nix::unistd::getuid().as_raw();
    if peer.uid() != 0 && peer.uid() != me {
        bail!(
            "refused a request from uid {}: only the node plugin (root) may hand over a volume",
            peer.uid()
        );
    }
    // A probe ([`ping`]) connects and closes without a word.
    let peeked = nix::sys::socket::recv(
        conn.as_raw_fd(),
        &mut [0u8],
        nix::sys::socket::MsgFlags::MSG_PEEK,
    );
    if matches!(peeked, Ok(0)) {
        return Ok(());
    }
    let dev = crate::mount::handover::recv_fd(&conn, socket)?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .context("cannot read the request")?;
    let req: Request = serde_json::from_str(&line).context("the request is not valid JSON")?;
    let mut out = &conn;
    let (mut child, info) = match spawn_daemon(&req, dev) {
        Ok(c) => c,
        Err(e) => {
            let tail = format!("{e:#}");
            send_event(&mut out, &Event::Exited { code: 127, tail });
            return Err(e);
        }
    };
    crate::eprintln_lossy!(
        "loosefs csi-mounter: volume {}: serving {} (pid {})",
        req.volume_id,
        req.source,
        child.id()
    );
    send_event(&mut out, &Event::Started { pid: child.id() });
    // The keeper's offer line once the first daemon serves (nothing if it ends before).
    if let Some(info) = info {
        let mut line = String::new();
        let _ = BufReader::new(std::fs::File::from(info)).read_line(&mut line);
        if !line.trim().is_empty() {
            send_event(
                &mut out,
                &Event::Kept {
                    line: line.trim().to_string(),
                },
            );
        }
    }
    let status = child.wait().context("cannot wait for the daemon")?;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let tail = tail_of(&req.dir);
    crate::eprintln_lossy!(
        "loosefs csi-mounter: volume {}: daemon {} ended ({code}){}",
        req.volume_id,
        child.id(),
        if code == 0 {
            String::new()
        } else {
            format!(": {tail}")
        }
    );
    send_event(&mut out, &Event::Exited { code, tail });
    Ok(())
}

/// Writes one event line; a node plugin that stopped listening is not an error.
fn send_event(out: &mut &UnixStream, event: &Event) {
    if let Ok(mut s) = serde_json::to_string(event) {
        s.push('\n');
        let _ = out.write_all(s.as_bytes());
    }
}

/// Starts `loosefs mount SOURCE /dev/fd/3 --foreground --keeper` for `req` on `dev`, in its
/// own session, its standard error in `<dir>/daemon.err`, with no way to gain privileges: the
/// process is the volume's keeper, its child the daemon. A new volume's keeper says its offer
/// line on the returned pipe (its fd 4); a volume taken over (`req.kept`) is given it.
/// Errors: the volume's directory is not this user's, the binary cannot start, `req.kept` is
/// not an offer line.
fn spawn_daemon(req: &Request, dev: OwnedFd) -> Result<(std::process::Child, Option<OwnedFd>)> {
    use std::os::unix::fs::MetadataExt;
    let dir = &req.dir;
    let cache = req.cache.as_ref().unwrap_or(dir);
    for d in [dir, cache] {
        let meta =
            std::fs::metadata(d).with_context(|| format!("volume directory {}", d.display()))?;
        if !d.is_absolute() || meta.uid() != nix::unistd::getuid().as_raw() {
            bail!(
                "volume directory {} is not an absolute directory of uid {}",
                d.display(),
                nix::unistd::getuid()
            );
        }
    }
    let exe = std::env::current_exe().context("cannot find the loosefs binary")?;
    let err = std::fs::File::create(dir.join("daemon.err"))
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    // Both descriptors above 4 first, so that making them 3 and 4 in the child never closes
    // one with the other.
    let dev = above(dev)?;
    let src = dev.as_raw_fd();
    let mut cmd = std::process::Command::new(exe);
    // The volume's options first, the mounter's own after them (clap refuses a second
    // `--log`), then `--`: a source is never read as an option or a mount(8) `-o` list.
    cmd.arg("mount")
        .args(&req.args)
        .arg("--foreground")
        .arg("--keeper")
        .arg("--log")
        .arg(dir.join("daemon.log"))
        .arg("--cache-dir")
        .arg(cache.join("cache"))
        .arg("--index-dir")
        .arg(cache.join("index"))
        .arg("--")
        .arg(&req.source)
        .arg("/dev/fd/3")
        .env("LOOSEFS_FUSE_FD", "3")
        .envs(req.secrets.vars())
        .stdin(std::process::Stdio::null())
        .stdout(err.try_clone()?)
        .stderr(err);
    let (info, info_w) = match &req.kept {
        Some(line) => {
            for (k, v) in crate::mount::keeper::taken_over_env(line)? {
                cmd.env(k, v);
            }
            (None, None)
        }
        None => {
            let (r, w) = nix::unistd::pipe().context("cannot create a pipe")?;
            nix::fcntl::fcntl(
                &r,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )?;
            cmd.env(crate::mount::keeper::INFO_FD_ENV, "4");
            (Some(r), Some(w))
        }
    };
    let info_w = info_w.map(above).transpose()?;
    let info_src = info_w.as_ref().map_or(-1, |w| w.as_raw_fd());
    // SAFETY: between fork and exec only async-signal-safe calls: setsid and prctl.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Then (pre_exec closures run in order) the connection as fd 3, the info pipe as fd 4.
    crate::mount::handover::place_fd(&mut cmd, src, 3);
    if info_src >= 0 {
        crate::mount::handover::place_fd(&mut cmd, info_src, 4);
    }
    let child = cmd.spawn().context("cannot start the daemon")?;
    drop(dev);
    drop(info_w);
    Ok((child, info))
}

/// `fd` moved to a descriptor number of 10 or more (close-on-exec).
fn above(fd: OwnedFd) -> Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let n = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// The last lines (at most 5, 1 KiB) the daemon wrote to its standard error and its log.
fn tail_of(dir: &Path) -> String {
    let mut lines: Vec<String> = Vec::new();
    for name in ["daemon.err", "daemon.log"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(name)) {
            lines.extend(
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_string),
            );
        }
    }
    lines.dedup();
    let start = lines.len().saturating_sub(5);
    let mut tail = lines[start..].join(" | ");
    if tail.len() > 1024 {
        let mut cut = tail.len() - 1024;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = tail[cut..].to_string();
    }
    tail
}

/// Whether a mounter answers at `socket` (a connection that says nothing: the mounter closes
/// it without a word). Errors: none answers, or it runs as root.
pub fn ping(socket: &Path) -> Result<()> {
    connect(socket).map(drop)
}

/// The node plugin's side: a connection to the mounter at `socket`, and the mounter's user
/// (uid, gid), read from the socket (SO_PEERCRED), who must own the volume's directory.
/// Errors: no mounter listens there (named, with what to check).
pub fn connect(socket: &Path) -> Result<(UnixStream, (u32, u32))> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let conn = UnixStream::connect(socket).with_context(|| {
        format!(
            "no loosefs csi-mounter answers at {} (is its container running, sharing that \
             directory with the node plugin?)",
            socket.display()
        )
    })?;
    let peer = getsockopt(&conn, PeerCredentials).context("cannot read the mounter's uid")?;
    if peer.uid() == 0 {
        bail!(
            "the mounter at {} runs as root: volumes are served only by an unprivileged mounter",
            socket.display()
        );
    }
    Ok((conn, (peer.uid(), peer.gid())))
}

/// Hands `dev` and `req` over on `conn` (from [`connect`]) and returns a reader of the
/// mounter's [`Event`]s. Errors: the mounter closed the connection.
pub fn hand_over(
    conn: UnixStream,
    dev: OwnedFd,
    req: &Request,
    socket: &Path,
) -> Result<impl Iterator<Item = Event> + Send + 'static> {
    crate::mount::handover::send_fd(&conn, dev, socket)?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    (&conn)
        .write_all(line.as_bytes())
        .with_context(|| format!("cannot send the request to {}", socket.display()))?;
    Ok(BufReader::new(conn)
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| serde_json::from_str(&l).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_one_json_line_each_way() {
        let e = Event::Exited {
            code: 1,
            tail: "cannot open /data: Permission denied".into(),
        };
        let s = serde_json::to_string(&e).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<Event>(&s).unwrap(), e);
        let s = serde_json::to_string(&Event::Started { pid: 7 }).unwrap();
        assert_eq!(s, r#"{"started":{"pid":7}}"#);
    }

    #[test]
    fn the_tail_keeps_the_last_lines_of_both_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("daemon.err"), "a\nb\n").unwrap();
        let log: String = (0..10).map(|i| format!("line {i}\n")).collect();
        std::fs::write(d.path().join("daemon.log"), log).unwrap();
        assert_eq!(
            tail_of(d.path()),
            "line 5 | line 6 | line 7 | line 8 | line 9"
        );
    }
}
