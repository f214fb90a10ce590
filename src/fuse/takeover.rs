//! A FUSE connection served again by a new daemon (the keeper's swap, `crate::mount::keeper`):
//! what the kernel offered at FUSE_INIT, kept as text so a new daemon can be told it; fuser's
//! handshake replayed on a socket pair so the new daemon's session is built without a second
//! FUSE_INIT on the connection; and `FUSE_NOTIFY_RESEND`, which puts the requests a dead daemon
//! had read but not answered back in the connection's queue.
//!
//! Layouts from `include/uapi/linux/fuse.h` (7.40 and later): `fuse_in_header { len: u32,
//! opcode: u32, unique: u64, nodeid: u64, uid: u32, gid: u32, pid: u32, total_extlen: u16,
//! padding: u16 }` (40 bytes), `fuse_init_in { major, minor, max_readahead, flags, flags2:
//! u32, unused: [u32; 11] }` (64 bytes), `fuse_out_header { len: u32, error: i32, unique:
//! u64 }` (16 bytes; a notification has unique 0 and its code in `error`).
//!
//! Why resend is enough on `/dev/fuse` and not on the ring: the kernel's `fuse_resend` moves
//! the processing lists of the connection's `/dev/fuse` devices back to its pending queue; a
//! device's list outlives a daemon only while someone else (the keeper) holds that device's
//! file open, and a daemon's own clones (`FUSE_DEV_IOC_CLONE`) end their requests with
//! ECONNABORTED when it dies. A ring entry's request (FUSE over io_uring) is on the ring
//! queue's list, which no notification resends: so a kept mount is served over `/dev/fuse`.

use anyhow::{Context, Result, bail};
use fuser::InitFlags;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// `FUSE_INIT` in `enum fuse_opcode`.
const FUSE_INIT: u32 = 26;
/// `FUSE_NOTIFY_RESEND` in `enum fuse_notify_code` (Linux 6.9, protocol 7.40).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// Bytes of `fuse_in_header` and of `fuse_init_in`.
const IN_HEADER: usize = 40;
const INIT_IN: usize = 64;

/// What the kernel offered at a connection's FUSE_INIT: the protocol's minor version (major 7),
/// its capability flags and its largest read-ahead (bytes). Written as `7.MINOR:FLAGS:RA`
/// (flags in hex) to hand to a new daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOffer {
    /// Minor version of protocol 7.
    pub minor: u32,
    /// Capability flags (`flags | flags2 << 32`).
    pub flags: u64,
    /// Largest read-ahead the kernel takes, bytes.
    pub max_readahead: u32,
}

impl InitOffer {
    /// The offer in `config` (fuser's view of the INIT it is answering).
    pub fn of(config: &mut fuser::KernelConfig) -> InitOffer {
        let v = config.kernel_abi();
        // fuser keeps the kernel's largest read-ahead private; asking for more than it says it.
        let max_readahead = config.set_max_readahead(u32::MAX).unwrap_or_else(|m| m);
        InitOffer {
            minor: v.1,
            flags: config.capabilities().bits(),
            max_readahead,
        }
    }

    /// Whether the kernel can resend requests a dead daemon had read (`FUSE_HAS_RESEND`).
    pub fn has_resend(&self) -> bool {
        InitFlags::from_bits_retain(self.flags).contains(InitFlags::FUSE_HAS_RESEND)
    }

    /// The offer without `FUSE_HAS_RESEND` (a kernel before 6.9, or `--resend=false`).
    pub fn without_resend(self) -> InitOffer {
        InitOffer {
            flags: self.flags & !InitFlags::FUSE_HAS_RESEND.bits(),
            ..self
        }
    }

    /// Parses `7.MINOR:FLAGS:RA` as [`std::fmt::Display`] writes it.
    ///
    /// Errors: any other text (named).
    pub fn parse(s: &str) -> Result<InitOffer> {
        let bad = || anyhow::anyhow!("{s:?} is not a FUSE_INIT offer (7.MINOR:FLAGS:READAHEAD)");
        let mut it = s.split(':');
        let minor = (it.next().and_then(|v| v.strip_prefix("7.")))
            .and_then(|m| m.parse().ok())
            .ok_or_else(bad)?;
        let flags = (it.next().and_then(|f| u64::from_str_radix(f, 16).ok())).ok_or_else(bad)?;
        let max_readahead = it.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(InitOffer {
            minor,
            flags,
            max_readahead,
        })
    }

    /// The FUSE_INIT request carrying this offer, as the kernel writes one (unique 1, from
    /// uid 0).
    fn request(&self) -> [u8; IN_HEADER + INIT_IN] {
        let mut r = [0u8; IN_HEADER + INIT_IN];
        r[0..4].copy_from_slice(&((IN_HEADER + INIT_IN) as u32).to_ne_bytes());
        r[4..8].copy_from_slice(&FUSE_INIT.to_ne_bytes());
        r[8..16].copy_from_slice(&1u64.to_ne_bytes());
        let i = IN_HEADER;
        r[i..i + 4].copy_from_slice(&7u32.to_ne_bytes());
        r[i + 4..i + 8].copy_from_slice(&self.minor.to_ne_bytes());
        r[i + 8..i + 12].copy_from_slice(&self.max_readahead.to_ne_bytes());
        let flags = self.flags | InitFlags::FUSE_INIT_EXT.bits();
        r[i + 12..i + 16].copy_from_slice(&(flags as u32).to_ne_bytes());
        r[i + 16..i + 20].copy_from_slice(&((flags >> 32) as u32).to_ne_bytes());
        r
    }
}

impl std::fmt::Display for InitOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "7.{}:{:x}:{}",
            self.minor, self.flags, self.max_readahead
        )
    }
}

/// A connection a new daemon takes over: the connection's device (a duplicate of the
/// keeper's), what the kernel offered at its INIT, and whether the daemon reads that very
/// device (the keeper resends a dead daemon's requests) or a clone of its own.
pub struct Takeover {
    /// The connection's device.
    pub dev: OwnedFd,
    /// What the kernel offered at the connection's INIT.
    pub offer: InitOffer,
    /// Whether this daemon reads the keeper's device (resend) or a clone of its own.
    pub resend: bool,
}

/// A session end for fuser's handshake: a socket pair whose other end has `offer`'s FUSE_INIT
/// waiting. Give the returned descriptor to `fuser::Session::from_fd`; once it returns, call
/// [`Replayed::attach`] to turn that very descriptor number into the connection's.
pub struct Replayed {
    ours: OwnedFd,
}

impl Replayed {
    /// The pair, with the request written. Returns this end (kept) and fuser's end.
    ///
    /// Errors: the socket pair cannot be made or written.
    pub fn new(offer: &InitOffer) -> Result<(Replayed, OwnedFd)> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (ours, fusers) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .context("cannot make a socket pair for the FUSE_INIT replay")?;
        let req = offer.request();
        nix::unistd::write(&ours, &req).context("cannot write the replayed FUSE_INIT")?;
        Ok((Replayed { ours }, fusers))
    }

    /// Makes descriptor `fusers` (the number fuser's session reads and writes, now that its
    /// handshake is done) a duplicate of `dev`, the connection's. fuser's answer to the
    /// replayed INIT is dropped: the kernel holds the first daemon's.
    ///
    /// Errors: fuser wrote no answer (its handshake failed), or `dup3` failed.
    pub fn attach(self, fusers: RawFd, dev: impl AsFd) -> Result<()> {
        let mut answer = [0u8; 512];
        let n = nix::sys::socket::recv(
            self.ours.as_raw_fd(),
            &mut answer,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )
        .context("fuser did not answer the replayed FUSE_INIT")?;
        if n < 16 || i32::from_ne_bytes(answer[4..8].try_into().unwrap_or_default()) != 0 {
            bail!("fuser refused the replayed FUSE_INIT ({n} bytes)");
        }
        swap_in(fusers, dev).context("cannot attach the FUSE connection")
    }
}

/// Makes descriptor number `session` (a fuser session's, whose threads have not started) a
/// duplicate of `dev` (`dup3`, atomic, close-on-exec): fuser keeps owning the number, which
/// now names `dev`'s open file.
///
/// Errors: `dup3`'s.
pub fn swap_in(session: RawFd, dev: impl AsFd) -> std::io::Result<()> {
    // SAFETY: dup3 replaces `session` atomically; the session owns that number and reads it
    // only once its threads start, after this.
    let rc = unsafe { libc::dup3(dev.as_fd().as_raw_fd(), session, libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `FUSE_NOTIFY_RESEND` on `dev`: every request read from the connection's shared
/// devices and not answered goes back to its queue (each with the `FUSE_UNIQUE_RESEND` bit in
/// its unique, which the answer echoes), to be read again by whoever serves it next.
///
/// Errors: the write (ENOSYS or EINVAL from a kernel before 6.9).
pub fn resend(dev: impl AsFd) -> std::io::Result<()> {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&16u32.to_ne_bytes());
    h[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    nix::sys::uio::writev(dev, &[IoSlice::new(&h)])?;
    Ok(())
}

/// A new `/dev/fuse` device of `dev`'s connection (`FUSE_DEV_IOC_CLONE`): requests read from
/// it end with the descriptor (ECONNABORTED to their callers) instead of staying on a device
/// someone else holds.
///
/// Errors: `/dev/fuse` cannot be opened, or the ioctl fails.
pub fn clone_device(dev: impl AsFd) -> Result<OwnedFd> {
    let new = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("cannot open /dev/fuse to clone the connection's device")?;
    let mut source = dev.as_fd().as_raw_fd() as u32;
    // FUSE_DEV_IOC_CLONE = _IOR(229, 0, uint32_t).
    const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
    // SAFETY: the ioctl reads one u32 (the source descriptor) from a live local.
    let rc = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &mut source) };
    if rc < 0 {
        bail!("FUSE_DEV_IOC_CLONE: {}", std::io::Error::last_os_error());
    }
    Ok(OwnedFd::from(new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_reads_back_as_written() {
        let o = InitOffer {
            minor: 44,
            flags: (1 << 39) | 0x1234,
            max_readahead: 131072,
        };
        assert_eq!(o.to_string(), "7.44:8000001234:131072");
        assert_eq!(InitOffer::parse(&o.to_string()).unwrap(), o);
        assert!(o.has_resend());
        assert!(!o.without_resend().has_resend());
        for bad in ["", "7.44", "8.1:0:0", "7.x:0:0", "7.44:zz:0", "7.44:0:0:0"] {
            assert!(InitOffer::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// fuser's own handshake on the replayed INIT, no root and no `/dev/fuse`: the session is
    /// built, fuser's answer is read and dropped, and the session's descriptor number then
    /// names the file it was attached to.
    #[test]
    fn a_session_is_built_on_a_replayed_init_and_attached_to_another_file() {
        struct Nothing;
        impl fuser::Filesystem for Nothing {}
        let offer = InitOffer {
            minor: 40,
            flags: (1 << 39) | InitFlags::FUSE_PARALLEL_DIROPS.bits(),
            max_readahead: 131072,
        };
        let (replayed, fusers) = Replayed::new(&offer).unwrap();
        let number = fusers.as_raw_fd();
        let cfg = fuser::Config::default();
        let session =
            fuser::Session::from_fd(Nothing, fusers, fuser::SessionACL::All, cfg).unwrap();
        let target = tempfile::tempfile().unwrap();
        replayed.attach(number, &target).unwrap();
        let ino = |fd: std::os::fd::BorrowedFd| nix::sys::stat::fstat(fd).unwrap().st_ino;
        assert_eq!(ino(session.as_fd()), ino(target.as_fd()));
    }

    #[test]
    fn a_handshake_that_wrote_no_answer_is_not_attached() {
        let offer = InitOffer::parse("7.40:0:4096").unwrap();
        let (replayed, fusers) = Replayed::new(&offer).unwrap();
        let target = tempfile::tempfile().unwrap();
        assert!(replayed.attach(fusers.as_raw_fd(), &target).is_err());
    }

    #[test]
    fn the_replayed_init_has_the_kernels_layout() {
        let o = InitOffer {
            minor: 44,
            flags: 1 << 39,
            max_readahead: 4096,
        };
        let r = o.request();
        let u32_at = |i: usize| u32::from_ne_bytes(r[i..i + 4].try_into().unwrap());
        assert_eq!(u32_at(0), 104);
        assert_eq!(u32_at(4), 26);
        assert_eq!(u64::from_ne_bytes(r[8..16].try_into().unwrap()), 1);
        assert_eq!((u32_at(40), u32_at(44), u32_at(48)), (7, 44, 4096));
        // INIT_EXT set in flags, the high half in flags2.
        assert_eq!(u32_at(52), 1 << 30);
        assert_eq!(u32_at(56), 1 << 7);
    }
}
