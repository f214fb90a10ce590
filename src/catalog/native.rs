//! The catalog of a native loosefs pack: names, directories and attributes read in place from
//! the pack's index, every file's bytes a range of the one pack file (object 0), checked
//! against the CRC-32 the index records.
//!
//! Decoded views (`--decode`) are part of the namespace: the `.npy` view of a JPEG record is
//! [`Node::Npy`], listed right after the JPEG under its stem + `.npy` (a real file of that name
//! wins; of two JPEGs with one stem the first by name gets it); the PPM view takes over the
//! JPEG's own inode. Their sizes come from the JPEG dimensions the index records, so `stat`
//! never decodes.

use super::{Attr, Catalog, DirEntry, Extent, FsError, FsStats, Kind, ObjectInfo, Transform};
use crate::ino::{Node, record_ino};
use crate::pack::index::{IndexView, Record, Totals};
use crate::pack::reader::Pack;
use crate::view::{self, ViewGeom, ViewKind, Views};
use memmap2::Mmap;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::sync::OnceLock;

/// `st_blksize` reported for every file, in bytes. Python's `BufferedReader` sizes its buffer
/// from it, so a large value lets `open(...).read()` and PIL fetch a sample in one request.
pub const BLKSIZE: u32 = 128 * 1024;

/// The catalog of one native pack, or of a foreign dataset through its loosefs index.
#[derive(Debug)]
pub struct NativeCatalog {
    /// The mapping holding the index bytes (the pack's, or a foreign dataset's index file).
    map: Arc<Mmap>,
    /// The index bytes inside `map` (validated).
    index: Range<usize>,
    totals: Totals,
    views: Views,
    objects: Vec<ObjectInfo>,
    /// Where each object starts in the records' `data_off` space: object `k` holds offsets
    /// `bases[k]..bases[k] + objects[k].len` (a native pack: one object at 0).
    bases: Vec<u64>,
    /// When the tree's order is not storage order (a foreign dataset): the file records in
    /// storage order, and each record's position there (`u32::MAX` for directories).
    order: Option<(Vec<u32>, Vec<u32>)>,
    /// Set once the pack was modified in place: why every request now fails.
    retired: OnceLock<String>,
    /// The pack file watched for changes once a writer opened it (a native pack only).
    watch: Option<Watch>,
    /// Whether the records' CRC-32s are to be checked (not for a loose directory's files).
    checks: bool,
}

impl NativeCatalog {
    /// The catalog of an opened pack, showing the decoded `views` of every JPEG sample (a
    /// file whose JPEG dimensions are in the index).
    pub fn new(pack: Pack, views: Views) -> NativeCatalog {
        let objects = vec![ObjectInfo {
            path: pack.path().to_path_buf(),
            len: pack.file_len(),
            data_end: pack.totals().data_end,
            align: u64::from(pack.totals().align),
        }];
        NativeCatalog {
            map: pack.map_arc(),
            index: pack.index_range(),
            totals: pack.totals(),
            views,
            objects,
            bases: vec![0],
            order: None,
            retired: OnceLock::new(),
            watch: pack.file().try_clone().ok().map(Watch::new),
            checks: true,
        }
    }

    /// The catalog of an index whose records address several objects: `data_off` of a record
    /// is `bases[k]` + the offset inside object `k`. `map[index]` must hold an index checked by
    /// [`IndexView::parse`] and [`IndexView::validate_tree`]. Errors: `bases` and `objects`
    /// differ in length or `bases` is not increasing.
    pub fn with_objects(
        map: Arc<Mmap>,
        index: Range<usize>,
        objects: Vec<ObjectInfo>,
        bases: Vec<u64>,
        views: Views,
    ) -> Result<NativeCatalog, FsError> {
        let ok = bases.len() == objects.len() && bases.windows(2).all(|w| w[0] <= w[1]);
        let totals = map
            .get(index.clone())
            .and_then(|b| IndexView::parse(b).ok())
            .map(|v| v.totals());
        let Some(totals) = totals.filter(|_| ok) else {
            return Err(FsError::Corrupt("malformed index or object table".into()));
        };
        let mut cat = NativeCatalog {
            map,
            index,
            totals,
            views,
            objects,
            bases,
            order: None,
            retired: OnceLock::new(),
            watch: None,
            checks: true,
        };
        // Read-ahead walks files in storage order; the tree (sorted by class and name) need
        // not follow it: keep the permutation (O(n log n) once, 8 bytes per record).
        let ix = cat.ix()?;
        let mut files: Vec<(u64, u32)> = (0..ix.len())
            .filter_map(|i| ix.record(i).filter(|r| !r.is_dir).map(|r| (r.data_off, i)))
            .collect();
        files.sort_unstable();
        let mut pos = vec![u32::MAX; ix.len() as usize];
        for (k, &(_, i)) in files.iter().enumerate() {
            pos[i as usize] = k as u32;
        }
        cat.order = Some((files.into_iter().map(|f| f.1).collect(), pos));
        Ok(cat)
    }

    /// The same catalog with no CRC-32 to check: its records address the original files
    /// themselves (a loose directory, [`crate::open::dir`]), which have no other copy to match.
    pub fn without_checksums(mut self) -> NativeCatalog {
        self.checks = false;
        self
    }

    /// The object and byte range inside it of a file record's data, or `None` for a
    /// directory or a range outside every object (only possible with a corrupted record).
    fn locate(&self, r: &Record) -> Option<(u32, Range<u64>)> {
        if r.is_dir {
            return None;
        }
        let end = r.data_off.checked_add(r.size)?;
        let k = self
            .bases
            .partition_point(|&b| b <= r.data_off)
            .checked_sub(1)?;
        // An empty file may sit at the very end of the object before a later base.
        let o = &self.objects[k];
        let (start, end) = (r.data_off - self.bases[k], end - self.bases[k]);
        (end <= o.data_end).then_some((k as u32, start..end))
    }

    /// A JPEG with known dimensions, or raw pixels: both have views.
    fn decodable(r: &Record) -> bool {
        !r.is_dir && r.width > 0 && r.height > 0
    }

    /// Raw RGB pixels served behind a view header (see [`crate::pack::index::PIXELS`]).
    fn pixels(r: &Record) -> bool {
        r.is_pixels()
    }

    /// The index, unless the catalog was retired (its pack modified in place: the mapped
    /// index may be gone or rewritten, so nothing reads it any more).
    fn ix(&self) -> Result<IndexView<'_>, FsError> {
        if let Some(w) = &self.watch
            && let Some(copy) = w.index.get()
        {
            if let Some(change) = w.changed() {
                self.retire(&format!(
                    "{} was modified in place while mounted ({change})",
                    self.objects[0].path.display()
                ));
            }
            if let Some(why) = self.retired.get() {
                return Err(FsError::Corrupt(why.clone()));
            }
            return IndexView::from_validated(copy, self.totals)
                .ok_or_else(|| FsError::Corrupt("index bounds".into()));
        }
        match self.retired.get() {
            Some(why) => Err(FsError::Corrupt(why.clone())),
            None => IndexView::from_validated(&self.map[self.index.clone()], self.totals)
                .ok_or_else(|| FsError::Corrupt("index bounds".into())),
        }
    }

    /// Retires the catalog (logging `why` once): every later request answers EIO.
    fn retire(&self, why: &str) {
        if self.retired.set(why.to_string()).is_ok() {
            log::error!("{why}; every file now answers EIO (unmount and mount again)");
        }
    }

    fn record(&self, i: u32) -> Result<Record, FsError> {
        self.ix()?.record(i).ok_or(FsError::NotFound)
    }

    /// The record and decoded view (if any) behind inode `ino`.
    fn resolve(&self, ino: u64) -> Result<(u32, Record, Option<ViewGeom>), FsError> {
        let (i, kind) = match Node::of(ino).ok_or(FsError::NotFound)? {
            Node::Record(i) => (i, self.views.ppm.then_some(ViewKind::Ppm)),
            Node::Npy(i) if self.views.npy => (i, Some(ViewKind::Npy)),
            _ => return Err(FsError::NotFound),
        };
        let r = self.record(i)?;
        let geom = self.geom(kind, &r);
        if kind == Some(ViewKind::Npy) && geom.is_none() {
            return Err(FsError::NotFound);
        }
        Ok((i, r, geom))
    }

    /// The view of `kind` that record `r` serves, if it is decodable.
    fn geom(&self, kind: Option<ViewKind>, r: &Record) -> Option<ViewGeom> {
        if Self::pixels(r) {
            // Raw pixels are always shown behind a header: PPM unless the .npy view is asked.
            return Some(ViewGeom {
                kind: kind.unwrap_or(ViewKind::Ppm),
                width: r.width,
                height: r.height,
                denom: 1,
            });
        }
        let k = kind.filter(|_| Self::decodable(r))?;
        Some(ViewGeom::new(k, r.width, r.height, self.views.max_side))
    }

    fn attr_of(&self, ino: u64, r: &Record, geom: Option<ViewGeom>) -> Attr {
        let size = geom.map_or(r.size, |g| g.size());
        Attr::shown(ino, r.kind(), size, r.mtime_sec, r.mtime_nsec, r.mode)
    }

    /// The child of directory `p` whose `.npy` view is named `stem` + `.npy`: the first JPEG
    /// sample (by name) with that stem.
    fn npy_owner(&self, p: &Record, stem: &[u8]) -> Option<u32> {
        let ix = self.ix().ok()?;
        let end = ix.children(p).end;
        let mut i = ix.lower_bound(p, stem);
        while i < end {
            let c = ix.record(i)?;
            let name = ix.name(&c);
            if !name.starts_with(stem) {
                return None;
            }
            if view::stem(name) == stem && Self::decodable(&c) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// Name of the `.npy` view listed beside child record `i` (named `name`) of `p`, if any.
    fn npy_sibling(&self, p: &Record, i: u32, c: &Record, name: &[u8]) -> Option<Vec<u8>> {
        if !self.views.npy || !Self::decodable(c) {
            return None;
        }
        let n = view::npy_name(name);
        let ix = self.ix().ok()?;
        (self.npy_owner(p, view::stem(name)) == Some(i) && ix.find_child(p, &n).is_none())
            .then_some(n)
    }

    fn dir(&self, ino: u64) -> Result<(u32, Record), FsError> {
        let (i, r, _) = match Node::of(ino) {
            Some(Node::Record(_)) => self.resolve(ino)?,
            Some(Node::Npy(_)) => return Err(FsError::NotDir),
            _ => return Err(FsError::NotFound),
        };
        if !r.is_dir {
            return Err(FsError::NotDir);
        }
        Ok((i, r))
    }
}

impl Catalog for NativeCatalog {
    fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        let (_, r, geom) = self.resolve(ino)?;
        Ok(self.attr_of(ino, &r, geom))
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let (_, p) = self.dir(parent)?;
        match name {
            b"." => return self.getattr(parent),
            b".." => return self.getattr(record_ino(p.parent)),
            _ => {}
        }
        let ix = self.ix()?;
        if let Some(i) = ix.find_child(&p, name) {
            let r = ix.record(i).ok_or(FsError::NotFound)?;
            if self.views.hides_jpeg() && Self::decodable(&r) {
                return Err(FsError::NotFound);
            }
            let geom = self.geom(self.views.ppm.then_some(ViewKind::Ppm), &r);
            return Ok(self.attr_of(record_ino(i), &r, geom));
        }
        if self.views.npy {
            if let Some(stem) = name.strip_suffix(b".npy") {
                if let Some(i) = self.npy_owner(&p, stem) {
                    return self.getattr(Node::Npy(i).ino());
                }
            }
        }
        Err(FsError::NotFound)
    }

    /// Entries: `.`, `..`, then the children in name order, each JPEG followed by its `.npy`
    /// view when served (child `k` is at position `2 + 2k`, its view at `3 + 2k`).
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        let (_, r) = self.dir(ino)?;
        let ix = self.ix()?;
        let dots = [(ino, &b"."[..]), (record_ino(r.parent), &b".."[..])];
        for (k, (ino, name)) in dots.into_iter().enumerate().skip(offset as usize) {
            let e = DirEntry {
                ino,
                next_offset: k as u64 + 1,
                kind: Kind::Dir,
                name: Cow::Borrowed(name),
            };
            if add(e) {
                return Ok(());
            }
        }
        let kids = ix.children(&r);
        let first = u32::try_from(offset.saturating_sub(2) / 2)
            .unwrap_or(u32::MAX)
            .min(kids.len() as u32);
        for i in kids.start + first..kids.end {
            let pos = 2 + 2 * u64::from(i - kids.start);
            let Some(c) = ix.record(i) else { break };
            let name = ix.name(&c);
            if pos + 1 > offset && !(self.views.hides_jpeg() && Self::decodable(&c)) {
                let e = DirEntry {
                    ino: record_ino(i),
                    next_offset: pos + 1,
                    kind: c.kind(),
                    name: Cow::Borrowed(name),
                };
                if add(e) {
                    return Ok(());
                }
            }
            if pos + 2 > offset {
                if let Some(n) = self.npy_sibling(&r, i, &c, name) {
                    let e = DirEntry {
                        ino: Node::Npy(i).ino(),
                        next_offset: pos + 2,
                        kind: Kind::File,
                        name: Cow::Owned(n),
                    };
                    if add(e) {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    fn extent(&self, ino: u64) -> Result<Extent, FsError> {
        let (i, r, geom) = self.resolve(ino)?;
        if r.is_dir {
            return Err(FsError::IsDir);
        }
        let (object, range) = self.locate(&r).ok_or_else(|| {
            FsError::Corrupt(format!(
                "data range {}+{} is outside the stored data",
                r.data_off, r.size
            ))
        })?;
        Ok(Extent {
            record: i,
            object,
            range,
            crc32: r.crc(),
            transform: match geom {
                Some(g) if Self::pixels(&r) => Transform::Pixels(g),
                Some(g) => Transform::Decode(g),
                None => Transform::Identity,
            },
        })
    }

    /// Pack order: depth first, names sorted (the order `loosefs pack` writes the data in),
    /// skipping directories. O(depth) amortised. A view inode continues from its JPEG.
    fn next_file(&self, ino: u64) -> Option<u64> {
        if let Some((order, pos)) = &self.order {
            let r = Node::of(ino)?.record()?;
            let p = *pos.get(r as usize)?;
            return order
                .get(p.checked_add(1)? as usize)
                .map(|&i| record_ino(i));
        }
        let ix = self.ix().ok()?;
        let mut cur = Node::of(ino)?.record()?;
        let mut descend = false; // true: enter `cur` (a directory) instead of moving past it
        // Every step moves to a record with a higher number or up to a parent (whose number is
        // lower): bounded by twice the records, so a malformed tree cannot loop forever.
        for _ in 0..=2 * u64::from(ix.len()) + 2 {
            let r = ix.record(cur)?;
            if descend {
                let kids = ix.children(&r);
                if kids.is_empty() {
                    descend = false; // empty directory: move past it
                    continue;
                }
                cur = kids.start;
            } else {
                if cur == 0 {
                    return None; // past the root: no more files
                }
                let parent = ix.record(r.parent)?;
                if cur + 1 < ix.children(&parent).end {
                    cur += 1;
                } else {
                    cur = r.parent;
                    continue;
                }
            }
            let r = ix.record(cur)?;
            if !r.is_dir {
                return Some(record_ino(cur));
            }
            descend = true;
        }
        None
    }

    fn path_of(&self, ino: u64) -> String {
        let Some(node) = Node::of(ino) else {
            return format!("inode {ino}");
        };
        let Some(rec) = node.record() else {
            return format!("inode {ino}");
        };
        let Ok(ix) = self.ix() else {
            return format!("inode {ino}");
        };
        let mut parts = Vec::new();
        let mut cur = rec;
        while cur != 0 && parts.len() < 4096 {
            let Ok(r) = self.record(cur) else { break };
            parts.push(String::from_utf8_lossy(ix.name(&r)).into_owned());
            cur = r.parent;
        }
        parts.reverse();
        if let (Node::Npy(_), Some(last)) = (node, parts.last_mut()) {
            *last = String::from_utf8_lossy(&view::npy_name(last.as_bytes())).into_owned();
        }
        parts.join("/")
    }

    fn statfs(&self) -> FsStats {
        FsStats {
            blocks: self
                .objects
                .iter()
                .map(|o| o.len)
                .sum::<u64>()
                .div_ceil(4096),
            files: self.totals.records,
            bsize: 4096,
            namelen: 255,
        }
    }

    fn records(&self) -> u64 {
        self.totals.records
    }

    fn files(&self) -> u64 {
        self.totals.files
    }

    fn objects(&self) -> &[ObjectInfo] {
        &self.objects
    }

    fn views(&self) -> Views {
        self.views
    }

    fn checks(&self) -> bool {
        self.checks
    }

    fn opened_for_writing(&self) -> bool {
        let Some(w) = &self.watch else { return false };
        if w.index.get().is_none() {
            let copy: Box<[u8]> = self.map[self.index.clone()].into();
            let _ = w.index.set(copy);
            log::warn!(
                "{} was opened for writing while mounted; the mount goes on serving it as long as \
                 it is unchanged (a change makes every file answer EIO)",
                self.objects[0].path.display()
            );
        }
        true
    }
}

/// What a pack file was when it was mounted: its length and modification time, compared by
/// every request once a writer has opened it (an in-place write changes one or both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(file: &std::fs::File) -> std::io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

/// A native pack's file watched for in-place changes. Until a writer opens the pack (the
/// mount's read lease tells, [`Catalog::opened_for_writing`]) nothing is checked; from then
/// on the index is read from a private copy (a truncation could otherwise fault the mapping)
/// and every request first compares the file's [`Stamp`] with the one taken at mount.
#[derive(Debug)]
struct Watch {
    file: std::fs::File,
    /// `None` when the file could not be stat'ed at mount (then any writer retires it).
    mounted: Option<Stamp>,
    /// The index bytes, copied when a writer first opened the pack.
    index: OnceLock<Box<[u8]>>,
}

impl Watch {
    fn new(file: std::fs::File) -> Watch {
        Watch {
            mounted: Stamp::of(&file).ok(),
            file,
            index: OnceLock::new(),
        }
    }

    /// How the file differs from when it was mounted, if it does.
    fn changed(&self) -> Option<String> {
        let now = match Stamp::of(&self.file) {
            Ok(s) => s,
            Err(e) => return Some(format!("cannot stat it: {e}")),
        };
        match self.mounted {
            None => Some("its state at mount is unknown".into()),
            Some(was) if was.len != now.len => {
                Some(format!("{} bytes, then {} bytes", was.len, now.len))
            }
            Some(was) if was.mtime != now.mtime => Some("its modification time changed".into()),
            Some(_) => None,
        }
    }
}
