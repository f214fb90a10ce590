//! The on-disk block table of a block cache: one 16-byte entry per block, `LFB1`, the
//! block's CRC-32C, its length (u32 LE), then the CRC-32C of those 12 bytes. A block's bytes
//! are written before its entry, and an all-zero entry means "not cached", so a torn or stale
//! entry is never trusted without a check (see `docs/DESIGN.md`, "Remote packs").

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A block's entry: `(CRC-32C, length in bytes)`.
pub type Entry = (u32, u32);

/// Bytes of one entry.
pub const ENTRY: u64 = 16;
const MAGIC: &[u8; 4] = b"LFB1";

/// The entry of a block of `len` bytes whose CRC-32C is `crc`.
pub fn entry_bytes(crc: u32, len: u32) -> [u8; ENTRY as usize] {
    let mut e = [0u8; ENTRY as usize];
    e[..4].copy_from_slice(MAGIC);
    e[4..8].copy_from_slice(&crc.to_le_bytes());
    e[8..12].copy_from_slice(&len.to_le_bytes());
    let c = crc32c::crc32c(&e[..12]);
    e[12..].copy_from_slice(&c.to_le_bytes());
    e
}

/// `(crc, len)` of a well-formed entry; `None` for an empty, torn or foreign one.
pub fn parse_entry(e: &[u8]) -> Option<(u32, u32)> {
    let ok = e.len() == ENTRY as usize
        && &e[..4] == MAGIC
        && crc32c::crc32c(&e[..12]).to_le_bytes() == e[12..16];
    ok.then(|| {
        (
            u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            u32::from_le_bytes([e[8], e[9], e[10], e[11]]),
        )
    })
}

/// The table file of an object of `blocks` blocks.
#[derive(Debug)]
pub struct Table {
    file: File,
}

impl Table {
    /// The table in `file`, sized to `blocks` entries; returns it with the entries it held
    /// (`None` for blocks without a well-formed entry). Errors: the file cannot be read or
    /// resized.
    pub fn load(file: File, blocks: usize) -> io::Result<(Table, Vec<Option<Entry>>)> {
        let want = blocks as u64 * ENTRY;
        let have = file.metadata()?.len();
        let mut raw = vec![0u8; want as usize];
        let n = have.min(want) as usize;
        if n > 0 {
            file.read_exact_at(&mut raw[..n], 0)?;
        }
        if have != want {
            file.set_len(want)?;
        }
        let entries = raw.chunks(ENTRY as usize).map(parse_entry).collect();
        Ok((Table { file }, entries))
    }

    /// Records block `b` as cached with `crc` over `len` bytes.
    pub fn set(&self, b: usize, crc: u32, len: u32) -> io::Result<()> {
        self.file
            .write_all_at(&entry_bytes(crc, len), b as u64 * ENTRY)
    }

    /// Records block `b` as not cached.
    pub fn clear(&self, b: usize) -> io::Result<()> {
        self.file
            .write_all_at(&[0u8; ENTRY as usize], b as u64 * ENTRY)
    }

    /// Makes the table durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let e = entry_bytes(0xdead_beef, 1 << 20);
        assert_eq!(parse_entry(&e), Some((0xdead_beef, 1 << 20)));
        assert_eq!(parse_entry(&[0u8; 16]), None);
        assert_eq!(parse_entry(&e[..15]), None);
        for i in 0..16 {
            let mut d = e;
            d[i] ^= 1;
            assert_eq!(parse_entry(&d), None, "flipped byte {i} accepted");
        }
    }

    #[test]
    fn a_table_is_sized_to_the_object_and_keeps_its_entries() {
        let dir = tempfile::tempdir().unwrap();
        let f = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.path().join("blocks"))
                .unwrap()
        };
        let (t, e) = Table::load(f(), 4).unwrap();
        assert_eq!(e, vec![None; 4]);
        t.set(2, 7, 100).unwrap();
        drop(t);
        // A table from a larger object is cut, entries of the blocks kept stay.
        let (t, e) = Table::load(f(), 3).unwrap();
        assert_eq!(e, vec![None, None, Some((7, 100))]);
        assert_eq!(
            std::fs::metadata(dir.path().join("blocks")).unwrap().len(),
            48
        );
        t.clear(2).unwrap();
        let (_, e) = Table::load(f(), 3).unwrap();
        assert_eq!(e, vec![None; 3]);
    }
}
