//! The check of the tree an index's records form, made once when a pack is opened: a
//! checksum is no signature, so nothing walks a tree before it passes this.

use super::IndexView;
use crate::pack::FormatError;

impl IndexView<'_> {
    /// Checks the tree the records form, in one pass: the root is record 0, a directory that
    /// is its own parent; records are numbered breadth first, so the children of successive
    /// directories are successive ranges that together cover records `1..` exactly once, each
    /// child names the directory that lists it as its parent, and every child is numbered
    /// after its parent (so no cycle can exist); files have no children and their data lies in
    /// `[0, data_end)`; names are non-empty, contain no `/` or NUL, are not `.` or `..`, and are
    /// strictly increasing within a directory (unique, so lookups can binary-search); the
    /// file and directory counts match the header. A checksum is no signature: anyone can
    /// write one, so a pack is checked before anything walks it.
    ///
    /// Errors: [`FormatError::Corrupt`] naming the first bad record and what is wrong.
    pub fn validate_tree(&self) -> Result<(), FormatError> {
        let bad = |i: u32, why: String| FormatError::Corrupt(format!("index record {i}: {why}"));
        let n = self.len();
        let root = self.record(0).ok_or_else(|| bad(0, "missing".into()))?;
        if !root.is_dir || root.parent != 0 {
            return Err(bad(
                0,
                "the root must be a directory that is its own parent".into(),
            ));
        }
        let (mut next_child, mut files, mut dirs) = (1u32, 0u64, 0u64);
        for i in 0..n {
            let r = self.record(i).ok_or_else(|| bad(i, "missing".into()))?;
            let name_end = (r.name_off as usize).checked_add(r.name_len as usize);
            if name_end.is_none_or(|e| e > self.names.len()) {
                return Err(bad(i, "its name lies outside the name table".into()));
            }
            if r.is_dir {
                dirs += 1;
            } else {
                files += 1;
                if r.n_children != 0 {
                    return Err(bad(i, "a file with children".into()));
                }
                if r.data_off
                    .checked_add(r.size)
                    .is_none_or(|e| e > self.totals.data_end)
                {
                    return Err(bad(
                        i,
                        format!(
                            "data {}+{} lies outside the sample data (which ends at {})",
                            r.data_off, r.size, self.totals.data_end
                        ),
                    ));
                }
            }
            if i > 0 {
                let name = self.name(&r);
                if name.is_empty()
                    || name == b"."
                    || name == b".."
                    || name.contains(&b'/')
                    || name.contains(&0)
                {
                    return Err(bad(
                        i,
                        format!("invalid name {:?}", String::from_utf8_lossy(name)),
                    ));
                }
            }
            if !r.is_dir || r.n_children == 0 {
                continue;
            }
            if r.first_child != next_child {
                return Err(bad(
                    i,
                    format!(
                        "its children start at record {} where {next_child} was expected (not breadth first, or shared)",
                        r.first_child
                    ),
                ));
            }
            let end = r.first_child.checked_add(r.n_children).filter(|&e| e <= n);
            let end = end.ok_or_else(|| bad(i, "its children run past the record table".into()))?;
            let mut prev: Option<&[u8]> = None;
            for c in r.first_child..end {
                let child = self.record(c).ok_or_else(|| bad(c, "missing".into()))?;
                if child.parent != i {
                    return Err(bad(
                        c,
                        format!(
                            "listed under directory {i} but names {} as its parent",
                            child.parent
                        ),
                    ));
                }
                let name = self.name(&child);
                if prev.is_some_and(|p| p >= name) {
                    return Err(bad(
                        c,
                        format!(
                            "name {:?} is not after its sibling's in byte order (duplicate or unsorted)",
                            String::from_utf8_lossy(name)
                        ),
                    ));
                }
                prev = Some(name);
            }
            next_child = end;
        }
        if next_child != n {
            return Err(FormatError::Corrupt(format!(
                "index: records {next_child}..{n} belong to no directory"
            )));
        }
        if files != self.totals.files || dirs != self.totals.dirs {
            return Err(FormatError::Corrupt(format!(
                "index: {files} files and {dirs} directories, but the header says {} and {}",
                self.totals.files, self.totals.dirs
            )));
        }
        Ok(())
    }
}
