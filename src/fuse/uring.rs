//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, the `fuse` module's
//! `enable_uring`): after INIT (answered through `/dev/fuse` by fuser, which keeps FORGET,
//! INTERRUPT and notifications), the kernel hands requests to ring entries the daemon
//! registered, one queue per possible CPU, and a reply and the wait for the next request are
//! one submission: no `read`/`writev` on `/dev/fuse` per request. This module answers those
//! requests with the [`Fs`], exactly as the fuser adaptor ([`super::LooseFs`]) does;
//! `ring` runs the entries, `abi` is their bytes. `docs/DESIGN.md` ("FUSE over io_uring")
//! gives the measurements.

pub mod abi;
mod ring;

use super::{errno, failed, file_attr, file_type, negative_attr, read_guarded};
use crate::catalog::FsError;
use crate::fs::{Fs, TTL};
use abi::{InHeader, Op};
use fuser::FileAttr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

pub use ring::{MIN_PER_QUEUE, PAYLOAD, Prepared, StartError, enable, entries, start};

/// Answers requests taken from ring entries: the fuser adaptor's answers, written in the
/// kernel's layout.
pub struct Handler {
    server: Arc<Fs>,
    uid: u32,
    gid: u32,
}

/// A READ's destination: a ring entry's payload buffer, written by whichever thread serves
/// the read (a decode thread for a view).
struct Dest(*mut u8, usize);

// SAFETY: the buffer outlives the read: the ring thread waits for the reply (or for the
// callback to be dropped) before it touches or reuses the buffer.
unsafe impl Send for Dest {}

impl Handler {
    /// Answers with `server`; files appear owned by `uid`/`gid`.
    pub fn new(server: Arc<Fs>, uid: u32, gid: u32) -> Handler {
        Handler { server, uid, gid }
    }

    fn attr(&self, a: &crate::catalog::Attr) -> FileAttr {
        file_attr(a, self.uid, self.gid)
    }

    fn fail(&self, op: &str, ino: u64, e: &FsError) -> i32 {
        failed(&self.server, op, ino, e).code()
    }

    /// Answers the request in a ring entry's buffers (`header` and `payload`, the payload
    /// buffer), writing the reply over them; `input` is scratch space
    /// for the request's payload (a LOOKUP's name, a WRITE's bytes), which the reply may
    /// overwrite. Returns the request's commit id. A request that does not parse is answered
    /// EIO and logged.
    pub fn serve_entry(
        &self,
        header: &mut [u8; abi::HEADER_LEN],
        payload: &mut [u8],
        input: &mut Vec<u8>,
    ) -> u64 {
        let used = abi::payload_len(header).min(payload.len());
        input.clear();
        input.extend_from_slice(&payload[..used]);
        let commit = abi::commit_id(header);
        let (unique, res) = match abi::parse(header, input) {
            Ok((h, op)) => (h.unique, self.answer(&h, op, payload)),
            Err(err) => {
                log::error!("a malformed request from the kernel ({err}); answering EIO");
                (abi::unique(header), Err(libc::EIO))
            }
        };
        self.server.stats.transport.requests.fetch_add(1, Relaxed);
        let (errno, len) = match res {
            Ok(n) => (0, n),
            Err(code) => (code, 0),
        };
        abi::set_reply(header, unique, errno, len);
        commit
    }

    /// Answers one request: the reply's arguments written to `out` (the entry's payload
    /// buffer), their length returned, or the errno to answer.
    fn answer(&self, h: &InHeader, op: Op<'_>, out: &mut [u8]) -> Result<usize, i32> {
        let s = &self.server;
        let ino = h.nodeid;
        match op {
            Op::Lookup(name) => match s.lookup_as(h.uid, ino, name) {
                Ok(e) => put(out, &abi::entry_out(&self.attr(&e.attr), e.ttl)),
                // An entry with inode 0 is a negative entry the kernel caches for TTL.
                Err(FsError::NotFound) => put(out, &abi::entry_out(&negative_attr(), TTL)),
                Err(e) => Err(self.fail("lookup", ino, &e)),
            },
            Op::Getattr => match s.getattr(ino) {
                Ok(e) => put(out, &abi::attr_out(&self.attr(&e.attr), e.ttl)),
                Err(e) => Err(self.fail("getattr", ino, &e)),
            },
            Op::Setattr(size) => match s.setattr(ino, size) {
                Ok(e) => put(out, &abi::attr_out(&self.attr(&e.attr), e.ttl)),
                Err(e) => Err(self.fail("setattr", ino, &e)),
            },
            // Zero-message open and opendir, as the fuser adaptor answers them.
            Op::Open => {
                s.open();
                Err(libc::ENOSYS)
            }
            Op::Opendir | Op::Unsupported => Err(libc::ENOSYS),
            Op::Read { offset, size } => self.read(ino, offset, size, out),
            Op::Readdir { offset, size, plus } => {
                let room = out.len().min(size as usize);
                let mut d = abi::DirBuf::new(&mut out[..room]);
                let r = if plus {
                    s.readdirplus(ino, offset, |e, entry| {
                        let eo = abi::entry_out(&self.attr(&entry.attr), entry.ttl);
                        d.add(Some(&eo), e.ino, e.next_offset, file_type(e.kind), &e.name)
                    })
                } else {
                    s.readdir(ino, offset, |e| {
                        d.add(None, e.ino, e.next_offset, file_type(e.kind), &e.name)
                    })
                };
                r.map(|()| d.used())
                    .map_err(|e| self.fail("readdir", ino, &e))
            }
            Op::Write { offset, data } => match s.write(ino, offset, data, h.pid) {
                Ok(n) => put(out, &abi::write_out(n)),
                Err(e) => Err(self.fail("write", ino, &e)),
            },
            Op::Statfs => {
                let st = s.statfs();
                put(
                    out,
                    &abi::statfs_out(st.blocks, st.files, st.bsize, st.namelen),
                )
            }
            Op::Ioctl => {
                s.ioctl();
                Err(libc::ENOTTY)
            }
            Op::Empty => Ok(0),
            Op::Change => Err(errno(&s.refuse()).code()),
        }
    }

    /// A READ into `out`. The server may answer from another thread (a decoded view), so
    /// the bytes are copied by the reply callback and this waits for it; a panic below fails
    /// this request only (EIO), as in the fuser adaptor.
    fn read(&self, ino: u64, offset: u64, size: u32, out: &mut [u8]) -> Result<usize, i32> {
        let dest = Dest(out.as_mut_ptr(), out.len().min(size as usize));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let served = read_guarded(&self.server, ino, offset, size, move |r| {
            let dest = dest;
            let res = match r {
                Ok(bytes) => {
                    let n = bytes.len().min(dest.1);
                    // SAFETY: `dest` is the entry's payload buffer, at least `dest.1` bytes,
                    // not touched by the ring thread until this callback has sent its result
                    // or been dropped (see `Dest`).
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dest.0, n) };
                    Ok(n)
                }
                Err(e) => Err(errno(&e).code()),
            };
            let _ = tx.send(res);
        });
        // Waits even after a panic: the callback may have been handed to another thread.
        let res = rx.recv().unwrap_or(Err(libc::EIO));
        if served { res } else { Err(libc::EIO) }
    }
}

/// Copies a reply's arguments into the payload buffer.
fn put(out: &mut [u8], bytes: &[u8]) -> Result<usize, i32> {
    let dst = out.get_mut(..bytes.len()).ok_or(libc::EIO)?;
    dst.copy_from_slice(bytes);
    Ok(bytes.len())
}
