//! Reads of late files: each open checked against the version looked up, each read checked
//! again after its bytes are in (a write during it changes the modification time), so a
//! reader gets one version's bytes or EIO.

use super::Changes;
use crate::catalog::{FsError, Kind};
use crate::storage::files::{Stamp, open_original_beneath};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The version of a late file reads must find: a copy taken out of the lock.
pub(super) struct Version {
    rel: PathBuf,
    stamp: Stamp,
    reported: Arc<AtomicBool>,
}

impl Changes {
    /// Opens late file `k`, checked against its stamp. Errors: forgotten (ENOENT), a
    /// directory, or changed since it was looked up (EIO, logged once).
    pub fn open(&self, k: u64) -> Result<File, FsError> {
        self.open_version(k).map(|(f, _)| f)
    }

    fn open_version(&self, k: u64) -> Result<(File, Version), FsError> {
        let l = {
            let st = self.read();
            let l = st.late.get(&k).ok_or(FsError::NotFound)?;
            if l.attr.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            Version {
                rel: l.rel.clone(),
                stamp: l.stamp,
                reported: l.reported.clone(),
            }
        };
        let f = open_original_beneath(&self.root, &l.rel)
            .map_err(|e| self.changed(&l, &format!("cannot be opened ({e})")))?;
        self.check(&l, &f)?;
        Ok((f, l))
    }

    fn check(&self, l: &Version, f: &File) -> Result<(), FsError> {
        let now = f.metadata().map(|m| Stamp::of(&m));
        match now {
            Ok(s) if s == l.stamp => Ok(()),
            Ok(_) => Err(self.changed(l, "changed since it was looked up")),
            Err(e) => Err(self.changed(l, &format!("cannot be checked ({e})"))),
        }
    }

    fn changed(&self, l: &Version, what: &str) -> FsError {
        let msg = format!("{} {what}", l.rel.display());
        if !l.reported.swap(true, Relaxed) {
            log::warn!("{msg}: answering EIO (look it up again for its new content)");
        }
        FsError::Io(msg)
    }

    /// Reads up to `size` bytes of late file `k` at `offset`: the bytes of the version looked
    /// up, or an error. Errors: as [`Changes::open`]; a change during the read (EIO).
    pub fn read_at(&self, k: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let (f, l) = self.open_version(k)?;
        let l = &l;
        let len = l.stamp.len.saturating_sub(offset).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => return Err(self.changed(l, "is shorter than it was")),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::Io(format!("{}: {e}", l.rel.display()))),
            }
        }
        // A write during the read changed the modification time: those bytes may be mixed.
        self.check(l, &f)?;
        self.stats.late_reads.fetch_add(1, Relaxed);
        Ok(buf)
    }
}
