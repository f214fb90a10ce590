//! The zip records of a pack, as bytes (PKWARE APPNOTE 6.3.10 §4.3): local headers with
//! their alignment padding, central directory records, the end records; and the output stream
//! that tracks its position. Every member is STORED; ZIP64 fields appear only where a value
//! does not fit.

use crate::pack::FormatError;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};

/// The largest value a 32-bit zip field holds; at or past it a ZIP64 field is used.
const ZIP32_MAX: u64 = 0xFFFF_FFFF;
/// Extra field id of the alignment padding (APPNOTE 4.6.11, as zipalign writes it).
const PADDING_FIELD: u16 = 0xa11e;
/// Extra field id of the ZIP64 sizes and offset (APPNOTE 4.5.3).
const ZIP64_FIELD: u16 = 0x0001;
/// General purpose flag bit 11: the name is UTF-8.
const UTF8_FLAG: u16 = 0x0800;

/// The output stream and its position.
pub(super) struct Out<W: Write + Seek> {
    pub(super) inner: BufWriter<W>,
    pub(super) pos: u64,
}

impl<W: Write + Seek> Out<W> {
    pub(super) fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// Overwrites bytes at `at` (before the current position) and comes back.
    pub(super) fn patch(&mut self, at: u64, b: &[u8]) -> io::Result<()> {
        self.inner.seek(SeekFrom::Start(at))?;
        self.inner.write_all(b)?;
        self.inner.seek(SeekFrom::Start(self.pos))?;
        Ok(())
    }
}

/// One member as the central directory lists it.
pub(super) struct Member<'a> {
    pub(super) path: &'a str,
    pub(super) is_dir: bool,
    pub(super) mode: u32,
    pub(super) mtime_sec: i64,
    pub(super) crc32: u32,
    pub(super) size: u64,
    pub(super) header: u64,
}

/// Little-endian byte building for zip records.
trait Le {
    fn u16(&mut self, v: u16) -> &mut Self;
    fn u32(&mut self, v: u32) -> &mut Self;
    fn u64(&mut self, v: u64) -> &mut Self;
}

impl Le for Vec<u8> {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// A 32-bit zip field for `v`: `v`, or the ZIP64 marker when it does not fit.
fn zip32(v: u64) -> u32 {
    u32::try_from(v)
        .ok()
        .filter(|&x| u64::from(x) < ZIP32_MAX)
        .unwrap_or(u32::MAX)
}

/// MS-DOS (time, date) of a Unix time, UTC; 1980-01-01 00:00 outside 1980..=2107.
fn dos_time(sec: i64) -> (u16, u16) {
    let t = time::OffsetDateTime::from_unix_timestamp(sec)
        .ok()
        .and_then(|t| zip::DateTime::try_from(t).ok())
        .unwrap_or_default();
    (t.timepart(), t.datepart())
}

/// The local header of member `path` (`size` bytes, `crc32`) starting at offset `start`, its
/// extra field padded so the data starts on a multiple of `align` (APPNOTE 4.3.7, 4.6.11).
/// Errors: a name over 65,535 bytes.
pub(super) fn local_header(
    path: &str,
    mtime_sec: i64,
    size: u64,
    crc32: u32,
    start: u64,
    align: u32,
) -> Result<Vec<u8>, FormatError> {
    let name = path.as_bytes();
    let name_len = u16::try_from(name.len())
        .map_err(|_| FormatError::Corrupt(format!("member name of {} bytes", name.len())))?;
    let zip64 = size >= ZIP32_MAX;
    let mut extra = Vec::new();
    if zip64 {
        extra.u16(ZIP64_FIELD).u16(16).u64(size).u64(size);
    }
    let align = u64::from(align);
    let unaligned = (start + 30 + name.len() as u64 + extra.len() as u64) % align;
    if unaligned != 0 {
        let mut pad = align - unaligned;
        while pad < 6 {
            pad += align;
        }
        extra
            .u16(PADDING_FIELD)
            .u16(pad as u16 - 4)
            .u16(align as u16);
        extra.resize(extra.len() + pad as usize - 6, 0);
    }
    let (time, date) = dos_time(mtime_sec);
    let mut h = Vec::with_capacity(30 + name.len() + extra.len());
    h.u32(0x0403_4b50)
        .u16(if zip64 { 45 } else { 20 })
        .u16(UTF8_FLAG)
        .u16(0);
    h.u16(time)
        .u16(date)
        .u32(crc32)
        .u32(zip32(size))
        .u32(zip32(size));
    h.u16(name_len).u16(extra.len() as u16);
    h.extend_from_slice(name);
    h.extend_from_slice(&extra);
    Ok(h)
}

/// The central directory record of `m` (APPNOTE 4.3.12), ZIP64 fields where needed.
pub(super) fn central_record(m: &Member) -> Vec<u8> {
    let name = m.path.as_bytes();
    let mut extra = Vec::new();
    let (big_size, big_off) = (m.size >= ZIP32_MAX, m.header >= ZIP32_MAX);
    if big_size || big_off {
        let n = 16 * u16::from(big_size) + 8 * u16::from(big_off);
        extra.u16(ZIP64_FIELD).u16(n);
        if big_size {
            extra.u64(m.size).u64(m.size);
        }
        if big_off {
            extra.u64(m.header);
        }
    }
    let version = if big_size || big_off { 45 } else { 20 };
    let (time, date) = dos_time(m.mtime_sec);
    let kind = if m.is_dir {
        libc::S_IFDIR
    } else {
        libc::S_IFREG
    };
    let attrs = ((kind | (m.mode & 0o7777)) << 16) | if m.is_dir { 0x10 } else { 0 };
    let mut r = Vec::with_capacity(46 + name.len() + extra.len());
    r.u32(0x0201_4b50)
        .u16(0x0300 | version)
        .u16(version)
        .u16(UTF8_FLAG)
        .u16(0);
    r.u16(time)
        .u16(date)
        .u32(m.crc32)
        .u32(zip32(m.size))
        .u32(zip32(m.size));
    r.u16(name.len() as u16)
        .u16(extra.len() as u16)
        .u16(0)
        .u16(0)
        .u16(0);
    r.u32(attrs).u32(zip32(m.header));
    r.extend_from_slice(name);
    r.extend_from_slice(&extra);
    r
}

/// The end records after a central directory of `n` members at `cd_start`, `cd_len` bytes
/// long, written at offset `at`: the ZIP64 end record and its locator when a count or offset
/// does not fit 16/32 bits (APPNOTE 4.3.14-15), then the end of central directory record with
/// `comment` (the trailer).
pub(super) fn end_records(n: u64, cd_start: u64, cd_len: u64, at: u64, comment: &str) -> Vec<u8> {
    let mut e = Vec::with_capacity(98 + comment.len());
    if n >= 0xFFFF || cd_start >= ZIP32_MAX || cd_len >= ZIP32_MAX {
        e.u32(0x0606_4b50)
            .u64(44)
            .u16(0x0300 | 45)
            .u16(45)
            .u32(0)
            .u32(0);
        e.u64(n).u64(n).u64(cd_len).u64(cd_start);
        e.u32(0x0706_4b50).u32(0).u64(at).u32(1);
    }
    let n16 = u16::try_from(n)
        .ok()
        .filter(|&x| x < 0xFFFF)
        .unwrap_or(0xFFFF);
    e.u32(0x0605_4b50).u16(0).u16(0).u16(n16).u16(n16);
    e.u32(zip32(cd_len))
        .u32(zip32(cd_start))
        .u16(comment.len() as u16);
    e.extend_from_slice(comment.as_bytes());
    e
}
