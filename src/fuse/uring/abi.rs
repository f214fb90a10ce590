//! The bytes of FUSE over io_uring (Linux 6.14+, FUSE ABI 7.42+, `include/uapi/linux/fuse.h`
//! and `fs/fuse/dev_uring.c`): a ring entry's 288-byte header buffer, the requests the mount
//! answers parsed out of it and its payload buffer, and the replies written back. Pure
//! functions over byte slices, so every parse is testable (and fuzzed) without a kernel.
//!
//! A request arrives as `fuse_in_header` in the header's first 128 bytes, the operation's own
//! header (its first argument, e.g. `fuse_read_in`) in the next 128, and the remaining
//! arguments (a LOOKUP's name, a WRITE's data) in the payload buffer, whose used length is
//! `fuse_uring_ent_in_out.payload_sz` at byte 272. A reply is `fuse_out_header` in the first
//! 128 bytes and the operation's reply arguments, concatenated, in the payload buffer, with
//! their length in `payload_sz`.

use fuser::{FileAttr, FileType};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes of `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, `ring_ent_in_out`.
pub const HEADER_LEN: usize = 288;
/// Offset of the operation's own header (`op_in`).
const OP_IN: usize = 128;
/// Offset of `fuse_uring_ent_in_out` (`flags u64, commit_id u64, payload_sz u32, …`).
const ENT_IN_OUT: usize = 256;
/// Bytes of `struct fuse_in_header`.
const IN_HEADER_LEN: usize = 40;
/// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel an entry's two buffers.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply in the buffers, and wait for the next.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FATTR_SIZE` of `fuse_setattr_in.valid`.
const FATTR_SIZE: u32 = 1 << 3;

/// Why a ring entry's bytes are not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The header buffer is shorter than [`HEADER_LEN`].
    #[error("ring header of {0} bytes, expected {HEADER_LEN}")]
    Header(usize),
    /// `payload_sz` exceeds the payload buffer.
    #[error("payload of {0} bytes in a buffer of {1}")]
    Payload(usize, usize),
    /// An argument is missing or malformed (opcode given).
    #[error("malformed arguments of opcode {0}")]
    Args(u32),
}

/// The fields of `fuse_in_header` the mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// FUSE opcode.
    pub opcode: u32,
    /// The request's id; the reply names it.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// Caller's user id.
    pub uid: u32,
    /// Caller's process id.
    pub pid: u32,
}

/// A request the mount answers, with its arguments (borrowed from the ring's buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `FUSE_LOOKUP` of `name` in the node.
    Lookup(&'a [u8]),
    /// `FUSE_GETATTR`.
    Getattr,
    /// `FUSE_SETATTR`; the new size when the request sets one.
    Setattr(Option<u64>),
    /// `FUSE_OPEN` (answered ENOSYS: zero-message open).
    Open,
    /// `FUSE_OPENDIR` (answered ENOSYS: zero-message opendir).
    Opendir,
    /// `FUSE_READ` of `size` bytes at `offset`.
    Read {
        /// Byte offset in the file.
        offset: u64,
        /// Bytes asked for.
        size: u32,
    },
    /// `FUSE_READDIR` (`plus`: `FUSE_READDIRPLUS`) from entry `offset`, at most `size` bytes.
    Readdir {
        /// Entry offset (the previous entry's `next_offset`).
        offset: u64,
        /// Reply bytes at most.
        size: u32,
        /// Entries carry attributes (`FUSE_READDIRPLUS`).
        plus: bool,
    },
    /// `FUSE_WRITE` of `data` at `offset`.
    Write {
        /// Byte offset in the file.
        offset: u64,
        /// The bytes written.
        data: &'a [u8],
    },
    /// `FUSE_STATFS`.
    Statfs,
    /// `FUSE_IOCTL` (answered ENOTTY).
    Ioctl,
    /// `FUSE_RELEASE`, `FUSE_RELEASEDIR`, `FUSE_DESTROY`: an empty reply.
    Empty,
    /// Any request that would change the tree (answered EROFS).
    Change,
    /// Anything else (answered ENOSYS, as fuser's defaults do).
    Unsupported,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The `commit_id` the kernel gave the request in `header` (its reply's commit names it).
pub fn commit_id(header: &[u8]) -> u64 {
    u64_at(header, ENT_IN_OUT + 8)
}

/// The request's id in `header`'s `fuse_in_header` (for a reply to a request that does not
/// parse).
pub fn unique(header: &[u8]) -> u64 {
    u64_at(header, 8)
}

/// `payload_sz`: bytes of the request the kernel put in the payload buffer.
pub fn payload_len(header: &[u8]) -> usize {
    u32_at(header, ENT_IN_OUT + 16) as usize
}

/// Parses the request in a ring entry: `header` (at least [`HEADER_LEN`] bytes) and the
/// payload buffer. Errors: a short header, a `payload_sz` past the buffer, arguments that do
/// not fit (e.g. a LOOKUP without its name's NUL).
pub fn parse<'a>(header: &'a [u8], payload: &'a [u8]) -> Result<(InHeader, Op<'a>), ParseError> {
    if header.len() < HEADER_LEN {
        return Err(ParseError::Header(header.len()));
    }
    let used = payload_len(header);
    if used > payload.len() {
        return Err(ParseError::Payload(used, payload.len()));
    }
    let payload = &payload[..used];
    let h = InHeader {
        opcode: u32_at(header, 4),
        unique: u64_at(header, 8),
        nodeid: u64_at(header, 16),
        uid: u32_at(header, 24),
        pid: u32_at(header, 32),
    };
    const { assert!(IN_HEADER_LEN <= OP_IN) };
    let op_in = &header[OP_IN..ENT_IN_OUT];
    let bad = || ParseError::Args(h.opcode);
    let op = match h.opcode {
        1 => {
            // The name and its NUL (the kernel sends an empty first argument, so the name
            // is in the payload).
            let name = payload.strip_suffix(&[0]).ok_or_else(bad)?;
            if name.is_empty() || name.contains(&0) {
                return Err(bad());
            }
            Op::Lookup(name)
        }
        3 => Op::Getattr,
        4 => {
            let valid = u32_at(op_in, 0);
            Op::Setattr((valid & FATTR_SIZE != 0).then(|| u64_at(op_in, 16)))
        }
        14 => Op::Open,
        27 => Op::Opendir,
        15 | 28 | 44 => {
            let (offset, size) = (u64_at(op_in, 8), u32_at(op_in, 16));
            match h.opcode {
                15 => Op::Read { offset, size },
                o => Op::Readdir {
                    offset,
                    size,
                    plus: o == 44,
                },
            }
        }
        16 => {
            let size = u32_at(op_in, 16) as usize;
            let data = payload.get(..size).ok_or_else(bad)?;
            Op::Write {
                offset: u64_at(op_in, 8),
                data,
            }
        }
        17 => Op::Statfs,
        39 => Op::Ioctl,
        18 | 29 | 38 => Op::Empty,
        // SYMLINK MKNOD MKDIR UNLINK RMDIR RENAME LINK SETXATTR REMOVEXATTR CREATE FALLOCATE
        // RENAME2 TMPFILE
        6 | 8..=13 | 21 | 24 | 35 | 43 | 45 | 51 => Op::Change,
        _ => Op::Unsupported,
    };
    Ok((h, op))
}

/// Writes `fuse_out_header` (`len`, `error` as a negative errno or 0, `unique`) and
/// `payload_sz` into a ring entry's header buffer.
pub fn set_reply(header: &mut [u8], unique: u64, errno: i32, payload_len: usize) {
    header[..128].fill(0);
    header[0..4].copy_from_slice(&(16 + payload_len as u32).to_le_bytes());
    header[4..8].copy_from_slice(&(-errno).to_le_bytes());
    header[8..16].copy_from_slice(&unique.to_le_bytes());
    header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(payload_len as u32).to_le_bytes());
}

/// A time as `fuse_attr` carries it: seconds (two's complement before 1970) and nanoseconds.
fn time_parts(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                ((-s) as u64, 0)
            } else {
                ((-s - 1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

/// `S_IFMT` bits of a file type.
fn type_bits(k: FileType) -> u32 {
    match k {
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// `struct fuse_attr` (88 bytes) of `a`.
pub fn attr(a: &FileAttr) -> [u8; 88] {
    let mut b = [0u8; 88];
    let (at, an) = time_parts(a.atime);
    let (mt, mn) = time_parts(a.mtime);
    let (ct, cn) = time_parts(a.ctime);
    for (i, v) in [a.ino.0, a.size, a.blocks, at, mt, ct]
        .into_iter()
        .enumerate()
    {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let mode = type_bits(a.kind) | u32::from(a.perm);
    let words = [
        an, mn, cn, mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, a.flags,
    ];
    for (i, v) in words.into_iter().enumerate() {
        b[48 + i * 4..52 + i * 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// `struct fuse_entry_out` (128 bytes): `a` named for `ttl` (entry and attributes alike).
pub fn entry_out(a: &FileAttr, ttl: Duration) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[0..8].copy_from_slice(&a.ino.0.to_le_bytes());
    for at in [16, 24] {
        b[at..at + 8].copy_from_slice(&ttl.as_secs().to_le_bytes());
    }
    for at in [32, 36] {
        b[at..at + 4].copy_from_slice(&ttl.subsec_nanos().to_le_bytes());
    }
    b[40..].copy_from_slice(&attr(a));
    b
}

/// `struct fuse_attr_out` (104 bytes).
pub fn attr_out(a: &FileAttr, ttl: Duration) -> [u8; 104] {
    let mut b = [0u8; 104];
    b[0..8].copy_from_slice(&ttl.as_secs().to_le_bytes());
    b[8..12].copy_from_slice(&ttl.subsec_nanos().to_le_bytes());
    b[16..].copy_from_slice(&attr(a));
    b
}

/// `struct fuse_statfs_out` (80 bytes): no free blocks or inodes, `frsize` = `bsize`.
pub fn statfs_out(blocks: u64, files: u64, bsize: u32, namelen: u32) -> [u8; 80] {
    let mut b = [0u8; 80];
    b[0..8].copy_from_slice(&blocks.to_le_bytes());
    b[24..32].copy_from_slice(&files.to_le_bytes());
    for (at, v) in [(40, bsize), (44, namelen), (48, bsize)] {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// `struct fuse_write_out` (8 bytes).
pub fn write_out(written: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&written.to_le_bytes());
    b
}

/// A READDIR or READDIRPLUS reply built in place: `fuse_dirent`s (each padded to 8 bytes),
/// each after its `fuse_entry_out` for READDIRPLUS, up to the request's size.
pub struct DirBuf<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> DirBuf<'a> {
    /// Entries go into `buf` (the payload buffer cut to the request's size).
    pub fn new(buf: &'a mut [u8]) -> DirBuf<'a> {
        DirBuf { buf, len: 0 }
    }

    /// Adds an entry; `true` when it did not fit (the reply is full, as fuser's `add`).
    pub fn add(
        &mut self,
        entry: Option<&[u8; 128]>,
        ino: u64,
        next: u64,
        kind: FileType,
        name: &[u8],
    ) -> bool {
        let head = entry.map_or(0, |e| e.len());
        let dirent = (24 + name.len()).next_multiple_of(8);
        let end = self.len + head + dirent;
        if end > self.buf.len() {
            return true;
        }
        let b = &mut self.buf[self.len..end];
        if let Some(e) = entry {
            b[..head].copy_from_slice(e);
        }
        let d = &mut b[head..];
        d.fill(0);
        d[0..8].copy_from_slice(&ino.to_le_bytes());
        d[8..16].copy_from_slice(&next.to_le_bytes());
        d[16..20].copy_from_slice(&(name.len() as u32).to_le_bytes());
        d[20..24].copy_from_slice(&(type_bits(kind) >> 12).to_le_bytes());
        d[24..24 + name.len()].copy_from_slice(name);
        self.len = end;
        false
    }

    /// Bytes written.
    pub fn used(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
#[path = "abi_tests.rs"]
mod tests;
