//! A frame tree: a catalog that shows another catalog's tree unchanged plus made directories
//! in its directories (`frames/` and `columns/` at the top, `<name>.frames/` beside a video
//! file), whose files are made by a [`super::frames::FrameServer`]
//! (their extents carry [`Transform::Made`] with the made file's id).
//!
//! Its nodes are records after the base catalog's: record `base.records() + k` is node `k`
//! (inode `record_ino` of it, as for any record), so the inode spaces of [`crate::ino`] are
//! unchanged. Directory offsets of the made entries at the top start at [`TOP_OFFSET`], past any
//! the base catalog gives (in every base directory that holds made entries).

use crate::catalog::{
    Attr, Catalog, DirEntry, Extent, FsError, FsStats, Kind, ObjectInfo, Transform,
};
use crate::ino::{ROOT_INO, record_ino, record_of};
use crate::view::Views;
use std::borrow::Cow;
use std::sync::Arc;

/// First directory offset of the made entries in a base directory.
pub const TOP_OFFSET: u64 = 1 << 40;

/// A node of the made tree.
#[derive(Debug, Clone)]
pub struct MadeNode {
    /// Parent node (`None`: the base catalog's directory [`Self::at`]).
    pub parent: Option<u32>,
    /// The base catalog's directory (inode) a node without a made parent is in.
    pub at: u64,
    /// Name.
    pub name: Vec<u8>,
    /// A directory's children (node numbers, sorted by name), or a file's made id and size.
    pub what: What,
}

/// A directory or a made file.
#[derive(Debug, Clone)]
pub enum What {
    /// Children, sorted by name.
    Dir(Vec<u32>),
    /// Made file id and size in bytes.
    File(u32, u64),
}

/// Builds a made tree: directories by path, files added in the order read-ahead walks them.
#[derive(Debug, Default)]
pub struct Builder {
    nodes: Vec<MadeNode>,
    dirs: std::collections::HashMap<(u64, Vec<Vec<u8>>), u32>,
}

impl Builder {
    /// The made directory at `path` below the base directory `at`, made with its parents as
    /// needed.
    fn dir(&mut self, at: u64, path: &[Vec<u8>]) -> Option<u32> {
        if path.is_empty() {
            return None;
        }
        let key = (at, path.to_vec());
        if let Some(&d) = self.dirs.get(&key) {
            return Some(d);
        }
        let parent = self.dir(at, &path[..path.len() - 1]);
        let n = self.nodes.len() as u32;
        self.nodes.push(MadeNode {
            parent,
            at,
            name: path[path.len() - 1].clone(),
            what: What::Dir(Vec::new()),
        });
        if let Some(p) = parent
            && let What::Dir(kids) = &mut self.nodes[p as usize].what
        {
            kids.push(n);
        }
        self.dirs.insert(key, n);
        Some(n)
    }

    /// Adds the file `path` below the top (at least a directory and a name), made file `id`
    /// of `size` bytes.
    pub fn file(&mut self, path: &[&str], id: u32, size: u64) {
        self.file_in(ROOT_INO, path, id, size)
    }

    /// Adds the file `path` below the base catalog's directory `at` (inode; at least a made
    /// directory and a name), made file `id` of `size` bytes.
    pub fn file_in(&mut self, at: u64, path: &[&str], id: u32, size: u64) {
        let parts: Vec<Vec<u8>> = path.iter().map(|s| s.as_bytes().to_vec()).collect();
        let parent = self.dir(at, &parts[..parts.len() - 1]);
        let n = self.nodes.len() as u32;
        self.nodes.push(MadeNode {
            parent,
            at,
            name: parts[parts.len() - 1].clone(),
            what: What::File(id, size),
        });
        if let Some(p) = parent
            && let What::Dir(kids) = &mut self.nodes[p as usize].what
        {
            kids.push(n);
        }
    }

    /// The tree over `base`, files after one another in the order added.
    pub fn build(mut self, base: Arc<dyn Catalog>) -> FrameTree {
        let names: Vec<Vec<u8>> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for n in &mut self.nodes {
            if let What::Dir(kids) = &mut n.what {
                kids.sort_by(|a, b| names[*a as usize].cmp(&names[*b as usize]));
            }
        }
        let mut top: std::collections::HashMap<u64, Vec<u32>> = Default::default();
        let mut top_names = std::collections::HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.parent.is_none() {
                top.entry(n.at).or_default().push(i as u32);
                top_names.insert((n.at, n.name.clone()), i as u32);
            }
        }
        let files: Vec<u32> = (0..self.nodes.len() as u32)
            .filter(|&i| matches!(self.nodes[i as usize].what, What::File(..)))
            .collect();
        let mut next = vec![None; self.nodes.len()];
        for w in files.windows(2) {
            next[w[0] as usize] = Some(w[1]);
        }
        FrameTree {
            first: base.records() as u32,
            base,
            nodes: self.nodes,
            top,
            top_names,
            next,
            files: files.len() as u64,
        }
    }
}

/// A catalog with made directories at its top.
pub struct FrameTree {
    base: Arc<dyn Catalog>,
    /// Record number of node 0.
    first: u32,
    nodes: Vec<MadeNode>,
    /// Nodes without a made parent, by the base directory they are in, in the order added.
    top: std::collections::HashMap<u64, Vec<u32>>,
    /// The same, by (base directory, name).
    top_names: std::collections::HashMap<(u64, Vec<u8>), u32>,
    /// The file after each file node.
    next: Vec<Option<u32>>,
    files: u64,
}

impl FrameTree {
    /// The made node inode `ino` names, if it is one.
    fn node(&self, ino: u64) -> Option<(u32, &MadeNode)> {
        let r = record_of(ino)?.checked_sub(self.first)?;
        self.nodes.get(r as usize).map(|n| (r, n))
    }

    fn ino(&self, k: u32) -> u64 {
        record_ino(self.first + k)
    }

    fn attr(&self, k: u32, n: &MadeNode) -> Result<Attr, FsError> {
        let root = self.base.getattr(ROOT_INO)?;
        let (kind, size, mode) = match n.what {
            What::Dir(_) => (Kind::Dir, 0, 0o040_555),
            What::File(_, size) => (Kind::File, size, 0o100_444),
        };
        Ok(Attr::shown(
            self.ino(k),
            kind,
            size,
            root.mtime_sec,
            root.mtime_nsec,
            mode,
        ))
    }
}

impl Catalog for FrameTree {
    fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        match self.node(ino) {
            Some((k, n)) => self.attr(k, n),
            None => self.base.getattr(ino),
        }
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        if let Some((k, n)) = self.node(parent) {
            let What::Dir(kids) = &n.what else {
                return Err(FsError::NotDir);
            };
            return match name {
                b"." => self.attr(k, n),
                b".." => match n.parent {
                    Some(p) => self.attr(p, &self.nodes[p as usize]),
                    None => self.base.getattr(n.at),
                },
                _ => {
                    let i = kids
                        .binary_search_by(|c| self.nodes[*c as usize].name.as_slice().cmp(name))
                        .map_err(|_| FsError::NotFound)?;
                    let c = kids[i];
                    self.attr(c, &self.nodes[c as usize])
                }
            };
        }
        if !self.top_names.is_empty()
            && let Some(&k) = self.top_names.get(&(parent, name.to_vec()))
        {
            return self.attr(k, &self.nodes[k as usize]);
        }
        self.base.lookup(parent, name)
    }

    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        let entry = |k: u32, next: u64| DirEntry {
            ino: self.ino(k),
            next_offset: next,
            kind: match self.nodes[k as usize].what {
                What::Dir(_) => Kind::Dir,
                What::File(..) => Kind::File,
            },
            name: Cow::Borrowed(self.nodes[k as usize].name.as_slice()),
        };
        if let Some((k, n)) = self.node(ino) {
            let What::Dir(kids) = &n.what else {
                return Err(FsError::NotDir);
            };
            let parent = n.parent.map_or(n.at, |p| self.ino(p));
            let dots = [(self.ino(k), &b"."[..]), (parent, &b".."[..])];
            for (i, (d, name)) in dots.into_iter().enumerate() {
                let e = DirEntry {
                    ino: d,
                    next_offset: i as u64 + 1,
                    kind: Kind::Dir,
                    name: Cow::Borrowed(name),
                };
                if offset <= i as u64 && add(e) {
                    return Ok(());
                }
            }
            for (i, &c) in kids
                .iter()
                .enumerate()
                .skip(offset.saturating_sub(2) as usize)
            {
                if add(entry(c, i as u64 + 3)) {
                    return Ok(());
                }
            }
            return Ok(());
        }
        let Some(top) = self.top.get(&ino) else {
            return self.base.readdir(ino, offset, add);
        };
        if offset < TOP_OFFSET {
            let mut full = false;
            self.base.readdir(ino, offset, &mut |e| {
                full = add(e);
                full
            })?;
            if full {
                return Ok(());
            }
        }
        let from = offset.saturating_sub(TOP_OFFSET) as usize;
        for (i, &k) in top.iter().enumerate().skip(from) {
            if add(entry(k, TOP_OFFSET + i as u64 + 1)) {
                return Ok(());
            }
        }
        Ok(())
    }

    fn extent(&self, ino: u64) -> Result<Extent, FsError> {
        match self.node(ino) {
            Some((k, n)) => match n.what {
                What::Dir(_) => Err(FsError::IsDir),
                What::File(id, _) => Ok(Extent {
                    record: self.first + k,
                    object: 0,
                    range: 0..0,
                    crc32: None,
                    transform: Transform::Made(id),
                }),
            },
            None => self.base.extent(ino),
        }
    }

    fn next_file(&self, ino: u64) -> Option<u64> {
        match self.node(ino) {
            Some((k, _)) => self.next[k as usize].map(|n| self.ino(n)),
            None => self.base.next_file(ino),
        }
    }

    fn path_of(&self, ino: u64) -> String {
        let Some((_, mut n)) = self.node(ino) else {
            return self.base.path_of(ino);
        };
        let mut parts = vec![String::from_utf8_lossy(&n.name).into_owned()];
        while let Some(p) = n.parent {
            n = &self.nodes[p as usize];
            parts.push(String::from_utf8_lossy(&n.name).into_owned());
        }
        if n.at != ROOT_INO {
            parts.push(self.base.path_of(n.at));
        }
        parts.reverse();
        parts.join("/")
    }

    fn statfs(&self) -> FsStats {
        let mut s = self.base.statfs();
        s.files += self.nodes.len() as u64;
        s
    }

    fn records(&self) -> u64 {
        u64::from(self.first) + self.nodes.len() as u64
    }

    fn files(&self) -> u64 {
        self.base.files() + self.files
    }

    fn objects(&self) -> &[ObjectInfo] {
        self.base.objects()
    }

    fn views(&self) -> Views {
        self.base.views()
    }

    fn checks(&self) -> bool {
        self.base.checks()
    }

    fn opened_for_writing(&self) -> bool {
        self.base.opened_for_writing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: &FrameTree, ino: u64, from: u64) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        t.readdir(ino, from, &mut |e| {
            out.push((String::from_utf8_lossy(&e.name).into_owned(), e.next_offset));
            false
        })
        .unwrap();
        out
    }

    #[test]
    fn made_directories_show_beside_the_base_tree_and_resume_and_walk_in_order() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("meta")).unwrap();
        std::fs::write(d.path().join("meta/info.json"), b"{}").unwrap();
        let dir =
            crate::open::dir::LooseDir::open(d.path(), false, crate::progress::Progress::None)
                .unwrap();
        let base: Arc<dyn Catalog> = Arc::new(dir.catalog(Views::default()).unwrap());
        let mut b = Builder::default();
        b.file(&["frames", "cam", "episode_000000", "000001.npy"], 7, 100);
        b.file(&["frames", "cam", "episode_000000", "000000.npy"], 8, 100);
        b.file(&["columns", "episode_000000", "action.npy"], 9, 42);
        let t = b.build(base.clone());
        assert_eq!(t.records(), base.records() + 8);
        // The top: the base's entries, then the made directories, resumable past either.
        let top = names(&t, ROOT_INO, 0);
        let listed: Vec<&str> = top.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(listed, [".", "..", "meta", "frames", "columns"]);
        let after_meta = top[2].1;
        let rest: Vec<String> = names(&t, ROOT_INO, after_meta)
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(rest, ["frames", "columns"]);
        assert_eq!(names(&t, ROOT_INO, top[3].1)[0].0, "columns");
        // Lookups down to a file; its extent is made file 8, its size the given one.
        let frames = t.lookup(ROOT_INO, b"frames").unwrap();
        assert_eq!(frames.kind, Kind::Dir);
        let cam = t.lookup(frames.ino, b"cam").unwrap();
        let ep = t.lookup(cam.ino, b"episode_000000").unwrap();
        assert_eq!(t.lookup(ep.ino, b"..").unwrap().ino, cam.ino);
        let kids: Vec<String> = names(&t, ep.ino, 0).into_iter().map(|e| e.0).collect();
        assert_eq!(kids, [".", "..", "000000.npy", "000001.npy"]);
        let f0 = t.lookup(ep.ino, b"000000.npy").unwrap();
        assert_eq!((f0.kind, f0.size, f0.perm & 0o222), (Kind::File, 100, 0));
        assert_eq!(t.extent(f0.ino).unwrap().transform, Transform::Made(8));
        assert_eq!(t.path_of(f0.ino), "frames/cam/episode_000000/000000.npy");
        assert!(matches!(t.lookup(ep.ino, b"nope"), Err(FsError::NotFound)));
        assert!(matches!(t.extent(ep.ino), Err(FsError::IsDir)));
        // Read-ahead walks made files in the order they were added.
        let f1 = t.lookup(ep.ino, b"000001.npy").unwrap();
        assert_eq!(t.next_file(f1.ino), Some(f0.ino));
        let col = t.next_file(f0.ino).unwrap();
        assert_eq!(t.path_of(col), "columns/episode_000000/action.npy");
        assert_eq!(t.next_file(col), None);
        // The base's own files are the base's.
        let meta = t.lookup(ROOT_INO, b"meta").unwrap();
        let info = t.lookup(meta.ino, b"info.json").unwrap();
        assert_eq!(t.extent(info.ino).unwrap(), base.extent(info.ino).unwrap());
    }

    #[test]
    fn made_directories_show_beside_a_file_in_a_base_subdirectory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("clips/b")).unwrap();
        std::fs::write(d.path().join("clips/a.mp4"), b"x").unwrap();
        let dir =
            crate::open::dir::LooseDir::open(d.path(), false, crate::progress::Progress::None)
                .unwrap();
        let base: Arc<dyn Catalog> = Arc::new(dir.catalog(Views::default()).unwrap());
        let clips = base.lookup(ROOT_INO, b"clips").unwrap().ino;
        let mut b = Builder::default();
        b.file_in(clips, &["a.mp4.frames", "000000.npy"], 0, 10);
        b.file_in(clips, &["a.mp4.frames", "000001.npy"], 1, 10);
        let t = b.build(base.clone());
        let listed: Vec<String> = names(&t, clips, 0).into_iter().map(|e| e.0).collect();
        assert_eq!(listed, [".", "..", "a.mp4", "b", "a.mp4.frames"]);
        // The root is the base's own: nothing made there.
        let top: Vec<String> = names(&t, ROOT_INO, 0).into_iter().map(|e| e.0).collect();
        assert_eq!(top, [".", "..", "clips"]);
        assert!(matches!(
            t.lookup(ROOT_INO, b"a.mp4.frames"),
            Err(FsError::NotFound)
        ));
        let f = t.lookup(clips, b"a.mp4.frames").unwrap();
        assert_eq!(t.lookup(f.ino, b"..").unwrap().ino, clips);
        let f1 = t.lookup(f.ino, b"000001.npy").unwrap();
        assert_eq!(t.path_of(f1.ino), "clips/a.mp4.frames/000001.npy");
        assert_eq!(t.extent(f1.ino).unwrap().transform, Transform::Made(1));
        let b_dir = t.lookup(clips, b"b").unwrap();
        assert_eq!(b_dir.kind, Kind::Dir);
    }
}
