//! Little-endian byte layouts shared by the foreign parsers: a reader that reports truncation
//! instead of panicking, fields laid one after another, and the `u32 n | u32 offsets[n+1]`
//! table that starts MDS shards and LitData chunks (`formats.md` §3, §5).

use std::ops::Range;

/// The byte ranges of fields of lengths `lens` laid one after the other from `at`, or `None`
/// when they run past `end` (MDS columns and LitData leaves are stored this way).
pub(crate) fn consecutive(mut at: u64, lens: &[u64], end: u64) -> Option<Vec<Range<u64>>> {
    let mut out = Vec::with_capacity(lens.len());
    for l in lens {
        let next = at.checked_add(*l)?;
        out.push(at..next);
        at = next;
    }
    (at <= end).then_some(out)
}

/// A little-endian reader over a byte slice that reports truncation instead of panicking.
pub(crate) struct Le<'a> {
    /// The bytes read.
    pub b: &'a [u8],
    /// The next offset read.
    pub at: usize,
}

impl<'a> Le<'a> {
    /// A reader of `b` from offset `at`.
    pub fn new(b: &'a [u8], at: usize) -> Le<'a> {
        Le { b, at }
    }

    /// The next `n` bytes; `None` past the end.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    /// The next u16, little-endian; `None` past the end.
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }

    /// The next u32, little-endian; `None` past the end.
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    /// The next u64, little-endian; `None` past the end.
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

/// The item ranges of a `u32 n | u32 offsets[n+1] | items` table at the start of `data`
/// (offsets absolute in `data`). Each range is checked to lie in `data` and not run backwards.
/// Errors: a message saying what is wrong ("truncated header", "truncated offset table", "item
/// 3 at 90..40 lies past the end"), for the caller to prefix with the file's name.
pub(crate) fn offset_table(data: &[u8]) -> Result<Vec<Range<usize>>, String> {
    let mut le = Le::new(data, 0);
    let n = le.u32().ok_or("truncated header")? as usize;
    // Each entry is 4 bytes: a count the data cannot hold is refused before it is allocated.
    if n >= data.len() / 4 {
        return Err(format!("{n} items claimed in {} bytes", data.len()));
    }
    let offsets: Vec<usize> = (0..=n)
        .map(|_| le.u32().map(|o| o as usize))
        .collect::<Option<_>>()
        .ok_or("truncated offset table")?;
    offsets
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            if w[0] > w[1] || w[1] > data.len() {
                Err(format!("item {i} at {}..{} lies past the end", w[0], w[1]))
            } else {
                Ok(w[0]..w[1])
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(offsets: &[u32], body: &[u8]) -> Vec<u8> {
        let mut v = ((offsets.len() - 1) as u32).to_le_bytes().to_vec();
        for o in offsets {
            v.extend_from_slice(&o.to_le_bytes());
        }
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn le_reads_in_order_and_reports_truncation() {
        let b = [1u8, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 9];
        let mut le = Le::new(&b, 0);
        assert_eq!(le.u16(), Some(1));
        assert_eq!(le.u32(), Some(2));
        assert_eq!(le.u64(), Some(3));
        assert_eq!(le.u16(), None, "one byte left");
        assert_eq!(le.at, 14, "a failed read does not move");
        assert_eq!(le.bytes(usize::MAX), None, "no overflow");
        assert_eq!(le.bytes(1), Some(&[9u8][..]));
    }

    #[test]
    fn consecutive_fields_stop_at_the_end() {
        assert_eq!(consecutive(10, &[2, 3], 15), Some(vec![10..12, 12..15]));
        assert_eq!(consecutive(10, &[2, 3], 14), None);
        assert_eq!(consecutive(10, &[u64::MAX], u64::MAX), None, "overflow");
        assert_eq!(consecutive(5, &[], 5), Some(vec![]));
    }

    #[test]
    fn offset_tables_give_item_ranges() {
        // 2 items: header 4 + 3 offsets of 4 = 16 bytes, then 3 + 2 bytes.
        let d = table(&[16, 19, 21], b"abcde");
        assert_eq!(offset_table(&d), Ok(vec![16..19, 19..21]));
        assert_eq!(offset_table(&table(&[4], b"")), Ok(vec![]), "no items");
    }

    #[test]
    fn damaged_offset_tables_are_refused() {
        assert_eq!(offset_table(b"\x01\x00").unwrap_err(), "truncated header");
        // 2 items claimed, one offset present.
        let mut d = 2u32.to_le_bytes().to_vec();
        d.extend_from_slice(&[0; 12]);
        d.extend_from_slice(&[0; 4]);
        assert_eq!(
            offset_table(&d[..12]).unwrap_err(),
            "truncated offset table"
        );
        // A count of 2^32-1 in a few bytes: refused, not allocated.
        let e = offset_table(&u32::MAX.to_le_bytes()).unwrap_err();
        assert!(e.contains("items claimed"), "{e}");
        // Past the end, and backwards.
        let e = offset_table(&table(&[16, 99], b"")).unwrap_err();
        assert!(e.contains("item 0 at 16..99"), "{e}");
        let e = offset_table(&table(&[16, 19, 17], b"abcde")).unwrap_err();
        assert!(e.contains("item 1 at 19..17"), "{e}");
    }
}
