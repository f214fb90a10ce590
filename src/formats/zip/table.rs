//! A zip archive's members from its end record and central directory alone (PKWARE
//! APPNOTE.TXT 6.3.10: §4.3.12 central directory header, §4.3.14–4.3.16 zip64 end record,
//! locator and end record, §4.4.4 flag bit 3, §4.5.3 zip64 extra field), for an archive at a
//! URL, where reading every member's local header would be one request per member. A member's
//! data starts after its local header, whose extra field may differ from the central
//! directory's; with no data descriptor (flag bit 3 clear) the member fills the bytes up to the
//! next local header (or the central directory) exactly, so its local extra length is that gap
//! less the header, name and data. An archive where that does not hold (a data descriptor,
//! a gap no extra field can fill, a local header near either end that disagrees) is
//! refused with the reason: the caller reads it whole instead. Every served member is still
//! checked against the CRC-32 the directory records before its bytes are served.
//! Own code rather than the `zip` crate: the crate reads every local header to place a member.

use super::super::{Scan, read_at};
use anyhow::{Result, anyhow, bail};
use std::collections::HashSet;
use std::path::Path;

/// Bytes at the end of an archive that hold its end record wherever its comment puts it: the
/// 22-byte record, the longest comment (65,535) and the 20-byte zip64 locator before it.
pub const TAIL: u64 = 22 + 0xFFFF + 20;

/// Local headers that lie within this many bytes of the archive's start, or of its central
/// directory's start, are read and must agree with the placement (the remote index build
/// fetches the archive's first 1 MiB block, and these bytes before the directory).
pub const LOCAL_CHECKED: u64 = 64 << 10;

/// The largest central directory read, bytes (about 12M members of 40-byte names): one that
/// claims more is refused rather than held in memory.
pub const MAX_DIRECTORY: u64 = 1 << 30;

/// Reads `len` bytes at `off` (fewer only at the end of the archive).
pub type ReadAt<'a> = dyn FnMut(u64, usize) -> std::io::Result<Vec<u8>> + 'a;

/// Where the central directory lies, as the end record (or the zip64 end record) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directory {
    /// Offset of the first central directory header, bytes.
    pub start: u64,
    /// Length of the central directory, bytes.
    pub len: u64,
    /// Number of members.
    pub entries: u64,
}

/// One member as its central directory header records it, and where its data starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The name's bytes as stored.
    pub name: Vec<u8>,
    /// General purpose bit flags (bit 0 encrypted, bit 3 data descriptor).
    pub flags: u16,
    /// Compression method (0 stored, 8 deflated).
    pub method: u16,
    /// CRC-32 of the uncompressed data.
    pub crc32: u32,
    /// Stored (compressed) length, bytes.
    pub compressed: u64,
    /// Uncompressed length, bytes.
    pub size: u64,
    /// Offset of the member's local header, bytes.
    pub header: u64,
    /// Unix mode bits when a Unix system made the entry.
    pub unix_mode: Option<u32>,
    /// Offset of the member's data (after its local header), bytes; set by [`place`].
    pub data_start: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Finds the central directory of an archive of `len` bytes from its last [`TAIL`] bytes (and
/// the zip64 end record where the locator points). Errors: no end record whose comment ends
/// the archive, a multi-disk archive, a directory outside the archive.
pub fn directory(read: &mut ReadAt<'_>, len: u64) -> Result<Directory, String> {
    let from = len.saturating_sub(TAIL);
    let tail = read(from, (len - from) as usize).map_err(|e| e.to_string())?;
    let at = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| {
            tail[i..].starts_with(b"PK\x05\x06")
                && u16_at(&tail, i + 20).is_some_and(|c| i + 22 + usize::from(c) == tail.len())
        })
        .ok_or("no end of central directory record")?;
    let e = &tail[at..];
    let (disk, cd_disk) = (u16_at(e, 4).unwrap_or(0), u16_at(e, 6).unwrap_or(0));
    let mut d = Directory {
        entries: u64::from(u16_at(e, 10).unwrap_or(0)),
        len: u64::from(u32_at(e, 12).unwrap_or(0)),
        start: u64::from(u32_at(e, 16).unwrap_or(0)),
    };
    let locator = at.checked_sub(20).map(|l| &tail[l..at]);
    if let Some(l) = locator.filter(|l| l.starts_with(b"PK\x06\x07")) {
        let rec_at = u64_at(l, 8).unwrap_or(u64::MAX);
        let rec = read(rec_at, 56).map_err(|e| e.to_string())?;
        if !rec.starts_with(b"PK\x06\x06") || rec.len() < 56 {
            return Err(format!("no zip64 end record at {rec_at}"));
        }
        d = Directory {
            entries: u64_at(&rec, 32).unwrap_or(0),
            len: u64_at(&rec, 40).unwrap_or(0),
            start: u64_at(&rec, 48).unwrap_or(0),
        };
    } else if disk != 0 || cd_disk != 0 {
        return Err("a multi-disk archive".into());
    }
    if d.start.checked_add(d.len).is_none_or(|end| end > len) {
        return Err(format!(
            "the central directory ({} bytes at {}) runs past the end ({len} bytes)",
            d.len, d.start
        ));
    }
    if d.len > MAX_DIRECTORY || d.len < d.entries.saturating_mul(46) {
        return Err(format!(
            "a central directory of {} bytes for {} members (at most {MAX_DIRECTORY} bytes, at least 46 a member)",
            d.len, d.entries
        ));
    }
    Ok(d)
}

/// Reads the zip64 extra field of a header whose 32-bit fields are saturated (§4.5.3: the
/// 64-bit values follow in the order size, compressed, offset, for the saturated ones only).
fn zip64(extra: &[u8], m: &mut Member) -> Result<(), String> {
    let mut at = 0;
    while let (Some(id), Some(n)) = (u16_at(extra, at), u16_at(extra, at + 2)) {
        let body = extra
            .get(at + 4..at + 4 + usize::from(n))
            .ok_or("a truncated extra field")?;
        if id == 1 {
            let mut k = 0;
            for v in [&mut m.size, &mut m.compressed, &mut m.header] {
                if *v == u64::from(u32::MAX) {
                    *v = u64_at(body, k).ok_or("a truncated zip64 extra field")?;
                    k += 8;
                }
            }
            return Ok(());
        }
        at += 4 + usize::from(n);
    }
    let saturated = [m.size, m.compressed, m.header].contains(&u64::from(u32::MAX));
    if saturated {
        return Err("a saturated size or offset without a zip64 extra field".into());
    }
    Ok(())
}

/// The members the central directory `cd` (the bytes of `d`) records, in its order. Errors:
/// a header without its signature, truncated, or fewer than `d.entries`.
pub fn members(cd: &[u8], d: &Directory) -> Result<Vec<Member>, String> {
    let mut out = Vec::with_capacity(d.entries.min(1 << 20) as usize);
    let mut at = 0usize;
    for i in 0..d.entries {
        let h = cd
            .get(at..at + 46)
            .filter(|h| h.starts_with(b"PK\x01\x02"))
            .ok_or_else(|| format!("central directory header {i} is missing or damaged"))?;
        let n = |o| usize::from(u16_at(h, o).unwrap_or(0));
        let (name_len, extra_len, comment_len) = (n(28), n(30), n(32));
        let name = cd
            .get(at + 46..at + 46 + name_len)
            .ok_or_else(|| format!("central directory header {i} is truncated"))?;
        let extra = cd
            .get(at + 46 + name_len..at + 46 + name_len + extra_len)
            .ok_or_else(|| format!("central directory header {i} is truncated"))?;
        let made_by_unix = h[5] == 3;
        let mut m = Member {
            name: name.to_vec(),
            flags: u16_at(h, 8).unwrap_or(0),
            method: u16_at(h, 10).unwrap_or(0),
            crc32: u32_at(h, 16).unwrap_or(0),
            compressed: u64::from(u32_at(h, 20).unwrap_or(0)),
            size: u64::from(u32_at(h, 24).unwrap_or(0)),
            header: u64::from(u32_at(h, 42).unwrap_or(0)),
            unix_mode: made_by_unix.then(|| u32_at(h, 38).unwrap_or(0) >> 16),
            data_start: 0,
        };
        zip64(extra, &mut m).map_err(|why| format!("member {i}: {why}"))?;
        out.push(m);
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(out)
}

/// Places every member's data: it ends where the next local header (by offset) or the
/// central directory at `cd_start` begins. Errors (why the local headers are needed): a data
/// descriptor, an encrypted member, members that overlap, a gap no local extra field fills.
pub fn place(members: &mut [Member], cd_start: u64) -> Result<(), String> {
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&i| members[i].header);
    for (k, &i) in order.iter().enumerate() {
        let next = order.get(k + 1).map_or(cd_start, |&j| members[j].header);
        let m = &mut members[i];
        if m.flags & 0x8 != 0 {
            return Err("a member with a data descriptor".into());
        }
        let fixed = m.header + 30 + m.name.len() as u64;
        let extra = next
            .checked_sub(fixed)
            .and_then(|room| room.checked_sub(m.compressed))
            .filter(|&e| e <= 0xFFFF)
            .ok_or_else(|| {
                format!(
                    "member {:?} does not fill the bytes up to the next header",
                    String::from_utf8_lossy(&m.name)
                )
            })?;
        m.data_start = fixed + extra;
    }
    Ok(())
}

/// Checks member `m`'s local header `local` (its first 30 bytes and name) against its
/// placement: the signature, the same name, and the extra length [`place`] found.
pub fn check_local(m: &Member, local: &[u8]) -> Result<(), String> {
    let ok = local.starts_with(b"PK\x03\x04")
        && u16_at(local, 26).is_some_and(|n| usize::from(n) == m.name.len())
        && u16_at(local, 28)
            .is_some_and(|e| m.header + 30 + m.name.len() as u64 + u64::from(e) == m.data_start)
        && local.get(30..30 + m.name.len()) == Some(&m.name[..]);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the local header of {:?} at {} disagrees with the central directory",
            String::from_utf8_lossy(&m.name),
            m.header
        ))
    }
}

/// Scans the archive `src` from its end record and central directory ([`directory`],
/// [`members`], [`place`]; local headers within [`LOCAL_CHECKED`] of the archive's start or
/// of the directory's checked), giving the samples
/// [`super::scan`] gives (the same names, ranges, chunks and CRC-32s, in storage order).
/// Errors, naming the archive: the reasons above, and those `super::scan` refuses for (an
/// escaping, repeated or empty name, an encrypted member, another compression method).
pub fn scan(src: &Path) -> Result<Scan> {
    let len = std::fs::metadata(src)
        .map_err(|e| anyhow!("cannot read {}: {e}", src.display()))?
        .len();
    let bad = |why: String| anyhow!("{}: {why}", src.display());
    let mut read = |off: u64, n: usize| read_at(src, off, n);
    let d = directory(&mut read, len).map_err(bad)?;
    let cd = read_at(src, d.start, d.len as usize)?;
    let mut all = members(&cd, &d).map_err(bad)?;
    place(&mut all, d.start).map_err(bad)?;
    let near_end = d.start.saturating_sub(LOCAL_CHECKED);
    for m in (all.iter()).filter(|m| m.data_start <= LOCAL_CHECKED || m.header >= near_end) {
        let local = read_at(src, m.header, 30 + m.name.len())?;
        check_local(m, &local).map_err(bad)?;
    }
    samples_of(src, &all)
}

/// The scan of `members` of archive `src`, by the rules of [`super::scan`].
fn samples_of(src: &Path, members: &[Member]) -> Result<Scan> {
    let mut out = super::Members::new(src);
    let mut seen = HashSet::new();
    for m in members {
        let shown = String::from_utf8_lossy(&m.name).into_owned();
        if !seen.insert(&m.name) {
            bail!(
                "{}: member {shown:?} appears twice in the archive; refusing it (which copy is meant?)",
                src.display()
            );
        }
        let parts = super::member_path(&m.name).map_err(|why| {
            anyhow!(
                "{}: member {shown:?} {why}; refusing the archive",
                src.display()
            )
        })?;
        let link = m.unix_mode.unwrap_or(0) & libc::S_IFMT == libc::S_IFLNK;
        if m.name.ends_with(b"/") || link {
            continue;
        }
        if parts.is_empty() {
            bail!(
                "{}: member {shown:?} names no file (empty, or only `.`); refusing the archive",
                src.display()
            );
        }
        if m.flags & 1 != 0 {
            bail!(
                "{}: member {shown:?} is encrypted; loosefs cannot read it",
                src.display()
            );
        }
        let method = match m.method {
            0 => Ok(false),
            8 => Ok(true),
            other => Err(format!("method {other}")),
        };
        out.add(
            parts.join("/"),
            method,
            m.data_start,
            m.compressed,
            m.size,
            m.crc32,
        );
    }
    out.finish()
}

#[cfg(test)]
mod tests;
