//! The fixed-size trailer that locates the index: stored as the zip archive comment, which the
//! zip specification (APPNOTE 4.3.16) places at the very end of the file after the End Of
//! Central Directory record. Reading it costs one read of the last [`TRAILER_LEN`] bytes.
//!
//! Text form (ASCII, exactly 53 bytes): `loosefs:v0001:index@<16 hex offset>+<16 hex length>`.

use super::FormatError;

/// Length in bytes of the trailer (the archive comment).
pub const TRAILER_LEN: usize = 53;
const PREFIX: &str = "loosefs:v";

/// Location of the index member's data inside the pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Index format version written in the trailer.
    pub version: u32,
    /// Byte offset of the index data from the start of the pack.
    pub index_offset: u64,
    /// Length of the index data in bytes.
    pub index_len: u64,
}

impl Trailer {
    /// Encodes the trailer as the 53-byte archive comment.
    pub fn encode(&self) -> String {
        let s = format!(
            "{PREFIX}{:04}:index@{:016x}+{:016x}",
            self.version, self.index_offset, self.index_len
        );
        debug_assert_eq!(s.len(), TRAILER_LEN);
        s
    }

    /// Parses the last bytes of a pack file (`tail` must end where the file ends).
    ///
    /// Errors: [`FormatError::NotAPack`] when the tail is not a loosefs trailer preceded by a zip
    /// End Of Central Directory record whose comment length is [`TRAILER_LEN`];
    /// [`FormatError::Appended`] when a trailer is followed by more bytes.
    pub fn parse_tail(tail: &[u8]) -> Result<Trailer, FormatError> {
        const EOCD_LEN: usize = 22;
        if tail.len() < TRAILER_LEN + EOCD_LEN {
            return Err(FormatError::NotAPack(format!(
                "file is {} bytes, too short for a zip end record and loosefs trailer",
                tail.len()
            )));
        }
        let t = &tail[tail.len() - TRAILER_LEN..];
        let eocd = &tail[tail.len() - TRAILER_LEN - EOCD_LEN..tail.len() - TRAILER_LEN];
        let comment_len = u16::from_le_bytes([eocd[20], eocd[21]]) as usize;
        if eocd[..4] != [0x50, 0x4b, 0x05, 0x06] || comment_len != TRAILER_LEN {
            // A whole trailer earlier in the tail: bytes were appended after the pack.
            if let Some(p) = tail
                .windows(PREFIX.len())
                .rposition(|w| w == PREFIX.as_bytes())
                .filter(|&p| p + TRAILER_LEN < tail.len())
            {
                return Err(FormatError::Appended(
                    (tail.len() - (p + TRAILER_LEN)) as u64,
                ));
            }
            return Err(FormatError::NotAPack(
                "no loosefs trailer in the zip archive comment (not written by `loosefs pack`, or truncated)".into(),
            ));
        }
        let text = std::str::from_utf8(t)
            .map_err(|_| FormatError::NotAPack("trailer is not ASCII".into()))?;
        let bad = || FormatError::NotAPack(format!("malformed trailer {text:?}"));
        let rest = text.strip_prefix(PREFIX).ok_or_else(bad)?;
        let (version, rest) = rest.split_once(":index@").ok_or_else(bad)?;
        let (off, len) = rest.split_once('+').ok_or_else(bad)?;
        Ok(Trailer {
            version: version.parse().map_err(|_| bad())?,
            index_offset: u64::from_str_radix(off, 16).map_err(|_| bad())?,
            index_len: u64::from_str_radix(len, 16).map_err(|_| bad())?,
        })
    }
}

impl Trailer {
    /// The byte range of the index in a pack of `len` bytes, after the checks a local and a
    /// remote pack share: the index version this build reads, an index that ends before the
    /// central directory's end records and the trailer. Errors: [`FormatError::Version`],
    /// [`FormatError::Truncated`].
    pub fn index_range(&self, len: u64) -> Result<std::ops::Range<u64>, FormatError> {
        if self.version != super::index::INDEX_VERSION {
            return Err(FormatError::Version {
                found: self.version,
                supported: super::index::INDEX_VERSION,
            });
        }
        let limit = len.saturating_sub(TRAILER_LEN as u64 + 22);
        match self.index_offset.checked_add(self.index_len) {
            Some(end) if end <= limit => Ok(self.index_offset..end),
            _ => Err(FormatError::Truncated(format!(
                "the index at {}+{} lies past the end of the archive data ({limit} bytes)",
                self.index_offset, self.index_len
            ))),
        }
    }

    /// Checks that the samples' data (ending at `data_end`, from the index) lies before the
    /// index. Errors: [`FormatError::Truncated`].
    pub fn check_data_end(&self, data_end: u64) -> Result<(), FormatError> {
        if data_end > self.index_offset {
            return Err(FormatError::Truncated(format!(
                "sample data reaches byte {data_end} but the index starts at {}",
                self.index_offset
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_after_eocd() {
        let t = Trailer {
            version: 1,
            index_offset: 0x1234_5000,
            index_len: 987,
        };
        let mut tail = vec![0u8; 22];
        tail[..4].copy_from_slice(&[0x50, 0x4b, 0x05, 0x06]);
        tail[20..22].copy_from_slice(&(TRAILER_LEN as u16).to_le_bytes());
        tail.extend_from_slice(t.encode().as_bytes());
        assert_eq!(Trailer::parse_tail(&tail).unwrap(), t);
        // A different comment length is refused.
        tail[20] = 7;
        assert!(matches!(
            Trailer::parse_tail(&tail),
            Err(FormatError::NotAPack(_))
        ));
    }

    #[test]
    fn the_index_must_lie_in_the_archive_data_and_before_it_the_samples() {
        let t = |off, len| Trailer {
            version: crate::pack::index::INDEX_VERSION,
            index_offset: off,
            index_len: len,
        };
        // A pack of 1000 bytes: its data ends 75 bytes before the end (records + trailer).
        assert_eq!(t(800, 125).index_range(1000).unwrap(), 800..925);
        for bad in [t(800, 126), t(u64::MAX, 2), t(0, 2000)] {
            let e = bad.index_range(1000).unwrap_err();
            assert!(matches!(e, FormatError::Truncated(_)), "{e}");
        }
        let e = Trailer {
            version: 9,
            ..t(0, 1)
        }
        .index_range(1000)
        .unwrap_err();
        assert!(matches!(e, FormatError::Version { found: 9, .. }), "{e}");
        assert!(t(800, 10).check_data_end(800).is_ok());
        assert!(matches!(
            t(800, 10).check_data_end(801),
            Err(FormatError::Truncated(_))
        ));
    }
}
