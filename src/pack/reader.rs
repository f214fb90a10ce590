//! Opens a pack for serving: memory-maps the whole file, finds the index through the trailer,
//! checks it (magic, version, checksum, bounds, and the tree its records form) and keeps it in
//! place. Opening costs one hash pass and one validation pass over the index.

use super::FormatError;
use super::index::{IndexView, Record, Totals};
use super::trailer::Trailer;
use memmap2::Mmap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open, validated pack.
#[derive(Debug)]
pub struct Pack {
    path: PathBuf,
    file: File,
    map: Arc<Mmap>,
    index: Range<usize>,
    totals: Totals,
}

impl Pack {
    /// Opens and validates the pack at `path`.
    ///
    /// Errors: I/O errors opening or mapping the file; [`FormatError::NotAPack`] when there is
    /// no loosefs trailer (also what a truncated pack looks like); [`FormatError::Truncated`]
    /// when the index or the data it points at lies past the end of the file;
    /// [`FormatError::Version`], [`FormatError::Checksum`], [`FormatError::Corrupt`] from the
    /// index.
    pub fn open(path: &Path) -> Result<Pack, FormatError> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(FormatError::NotAPack(if meta.is_dir() {
                "a directory, not a pack file (`loosefs pack DIR OUT` makes one)".into()
            } else {
                "not a regular file".into()
            }));
        }
        let len = meta.len();
        if len == 0 {
            return Err(FormatError::NotAPack("the file is empty".into()));
        }
        // SAFETY: the map is read-only and packs are immutable once written (`loosefs pack`
        // renames a finished file into place). If another process truncates the file while it
        // is mapped, reads past the new end fault; that is the documented contract of packs.
        let map = unsafe { Mmap::map(&file)? };
        let tail = &map[map.len().saturating_sub(4096)..];
        let trailer = match Trailer::parse_tail(tail) {
            Ok(t) => t,
            Err(e @ FormatError::Appended(_)) => return Err(e),
            Err(e) if map.starts_with(b"PK\x03\x04") => {
                return Err(FormatError::NotAPack(format!(
                    "a zip archive without a loosefs trailer at its end: truncated, or not written by `loosefs pack` ({e})"
                )));
            }
            Err(e) => return Err(e),
        };
        let r = trailer.index_range(len)?;
        let index = r.start as usize..r.end as usize;
        let view = IndexView::parse(&map[index.clone()])?;
        view.validate_tree()?;
        let totals = view.totals();
        trailer.check_data_end(totals.data_end)?;
        // The checksum pass faulted every index page into this process; release the mappings
        // (the pages stay in the page cache) so the resident set grows only with the records
        // lookups actually touch.
        // SAFETY: read-only shared map of an immutable file: later accesses re-fault the same
        // bytes from the page cache or the file.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                index.start,
                index.end - index.start,
            )
        };
        Ok(Pack {
            path: path.to_path_buf(),
            file,
            map: Arc::new(map),
            index,
            totals,
        })
    }

    /// Path the pack was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the pack file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// The index, in place.
    pub fn index(&self) -> IndexView<'_> {
        IndexView::from_validated(&self.map[self.index.clone()], self.totals)
            .expect("index bounds were checked in Pack::open")
    }

    /// Byte range of the index inside the file (and the mapping).
    pub fn index_range(&self) -> Range<usize> {
        self.index.clone()
    }

    /// Totals from the index header.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The stored bytes of a file record, or `None` for a directory or a range outside the
    /// sample data (only possible with a corrupted record).
    pub fn data(&self, r: &Record) -> Option<&[u8]> {
        if r.is_dir {
            return None;
        }
        let end = r.data_off.checked_add(r.size)?;
        if end > self.totals.data_end {
            return None;
        }
        self.map.get(r.data_off as usize..end as usize)
    }

    /// Byte range of a file record's data, or `None` for a directory or a range outside the
    /// sample data (only possible with a corrupted record).
    pub fn data_range(&self, r: &Record) -> Option<std::ops::Range<u64>> {
        let end = r.data_off.checked_add(r.size)?;
        (!r.is_dir && end <= self.totals.data_end).then_some(r.data_off..end)
    }

    /// Fills `buf` from pack offset `off` (`pread`).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf, off)
    }

    /// The whole mapping (for read-ahead and residency checks).
    pub fn map(&self) -> &Mmap {
        &self.map
    }

    /// A shared handle on the mapping (pinning keeps it alive from its own thread).
    pub fn map_arc(&self) -> Arc<Mmap> {
        self.map.clone()
    }

    /// The open pack file (for eviction and warming).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Local storage over this pack's one file (object 0), sharing its mapping. Errors: the
    /// file handle cannot be duplicated.
    pub fn storage(&self) -> std::io::Result<crate::storage::local::LocalStorage> {
        use crate::storage::local::{LocalObject, LocalStorage};
        let object = LocalObject::new(self.file.try_clone()?, self.map.clone());
        Ok(LocalStorage::new(vec![object]))
    }
}
