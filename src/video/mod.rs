//! Video datasets as frames (`loosefs mount DIR MNT --decode frames`): a LeRobot v3 dataset
//! ([`lerobot`]) gets, beside its own tree, `frames/<camera>/episode_<NNNNNN>/<frame_index
//! 06d>.npy` and `.ppm` (H×W×3 uint8: the frame LeRobot's decoders return for that row) and
//! `columns/episode_<NNNNNN>/<feature>.npy` (T×D, the feature's dtype, from the data files);
//! every video file ([`VIDEO_EXTENSIONS`]) gets `<name>.frames/<n 06d>.npy` and `.ppm` beside
//! it, its frames in presentation order.
//!
//! - [`decoder`]: video files through FFmpeg's libraries, indexed without decoding, decoded a
//!   GOP at a time.
//! - [`frames`]: the server of the made files: GOPs decoded once, a bounded GOP cache, the
//!   next GOP decoded ahead.
//! - [`tree`]: the catalog that shows the made directories over the dataset's own tree.
//! - [`spool`]: the frame view of a prefix of loose objects, decoded from local copies.

pub mod decoder;
pub mod frames;
pub mod lerobot;
pub mod spool;
pub mod tree;

use crate::catalog::Catalog;
use crate::view::ViewKind;
use anyhow::{Context, Result, bail};
use frames::{FrameServer, Made};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Extensions (lowercase) of the files served as videos: `<name>.frames/` beside each.
pub const VIDEO_EXTENSIONS: [&str; 3] = ["mp4", "mkv", "webm"];

/// The video files of `cat`'s tree: (the directory's inode, the file's name, its path from
/// the root), in readdir order, directories walked breadth first.
fn video_files(cat: &dyn Catalog) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    let mut dirs = std::collections::VecDeque::from([(crate::ino::ROOT_INO, String::new())]);
    while let Some((dir, path)) = dirs.pop_front() {
        let mut kids = Vec::new();
        let _ = cat.readdir(dir, 0, &mut |e| {
            if &e.name[..] != b"." && &e.name[..] != b".." {
                kids.push((e.ino, e.kind, String::from_utf8_lossy(&e.name).into_owned()));
            }
            false
        });
        for (ino, kind, name) in kids {
            let rel = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}/{name}")
            };
            if kind == crate::catalog::Kind::Dir {
                dirs.push_back((ino, rel));
                continue;
            }
            let ext = Path::new(&name).extension().and_then(|e| e.to_str());
            if ext.is_some_and(|e| VIDEO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())) {
                out.push((dir, name, rel));
            }
        }
    }
    out
}

/// Checks that `p` is a regular file inside `root` once links are resolved: FFmpeg opens
/// whatever a path names, so a link out of the tree, a FIFO (which would block the indexing
/// forever) or a device is refused before it does. Errors: naming `p` and what it is.
fn regular_below(root: &Path, p: &Path) -> Result<()> {
    let real = p
        .canonicalize()
        .with_context(|| format!("cannot open {}", p.display()))?;
    let top = root
        .canonicalize()
        .with_context(|| format!("cannot open {}", root.display()))?;
    if !real.starts_with(&top) {
        bail!(
            "{}: leads out of {} (to {}): not decoded",
            p.display(),
            root.display(),
            real.display()
        );
    }
    let meta = std::fs::metadata(&real).with_context(|| format!("cannot open {}", p.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file: not decoded", p.display());
    }
    Ok(())
}

/// The frame tree of the directory at `root` over `base` (the directory's own catalog), and
/// the server of its made files (`decode`'s frame-cache budget of decoded GOPs, its decode
/// threads: `--decode-cache`, `--decode-threads`):
/// a LeRobot v3 dataset's episodes (if `root` is one, [`lerobot::detect`]) and every video
/// file's frames. Every video file is indexed (demuxed, not decoded) to know its frames; for
/// a LeRobot dataset, to choose each row's frame: rows with no frame within
/// [`lerobot::TOLERANCE_S`] are logged and answer EIO. A video file outside a LeRobot
/// dataset's that cannot be indexed gets no frames, logged.
///
/// Errors: `root` is neither a LeRobot v3 dataset nor holds a video file; the dataset's
/// metadata cannot be read ([`lerobot::LeRobot::open`]); one of its video files cannot be
/// indexed (names it); the decode threads cannot start.
pub fn frame_tree(
    root: &Path,
    base: Arc<dyn Catalog>,
    decode: &crate::decode::DecodeOptions,
) -> Result<(tree::FrameTree, Arc<FrameServer>)> {
    let ds = if lerobot::detect(root) {
        Some(lerobot::LeRobot::open(root)?)
    } else {
        None
    };
    let plain = video_files(base.as_ref());
    if ds.is_none() && plain.is_empty() {
        bail!(
            "{}: --decode frames needs a LeRobot v3 dataset (meta/info.json with codebase_version v3.x) \
             or video files ({})",
            root.display(),
            VIDEO_EXTENSIONS.map(|e| format!(".{e}")).join(", ")
        );
    }
    let mut files: Vec<PathBuf> = (ds.iter().flat_map(|d| d.episodes.iter()))
        .flat_map(|e| e.videos.iter().map(|v| v.0.clone()))
        .collect();
    files.extend(plain.iter().map(|f| PathBuf::from(&f.2)));
    files.sort();
    files.dedup();
    let dataset_files: std::collections::HashSet<&PathBuf> = (ds.iter())
        .flat_map(|d| d.episodes.iter())
        .flat_map(|e| e.videos.iter().map(|v| &v.0))
        .collect();
    let indexed: Vec<Result<decoder::VideoIndex>> = files
        .par_iter()
        .map(|rel| {
            let p = root.join(rel);
            regular_below(root, &p)?;
            decoder::VideoIndex::of(&p)
        })
        .collect();
    let mut videos = Vec::with_capacity(files.len());
    let mut unread = std::collections::HashSet::new();
    for (rel, ix) in files.iter().zip(indexed) {
        match ix {
            Ok(ix) => videos.push((root.join(rel), ix)),
            Err(e) if !dataset_files.contains(rel) => {
                log::error!("{e:#}; it gets no frames");
                unread.insert(rel.clone());
                // Kept in place (frameless) so the indices below match `files`.
                videos.push((root.join(rel), decoder::VideoIndex::empty()));
            }
            Err(e) => return Err(e),
        }
    }
    let mut made = Vec::new();
    let mut b = tree::Builder::default();
    if let Some(ds) = &ds {
        episode_frames(ds, &files, &videos, &mut b, &mut made);
    }
    for (dir, name, rel) in &plain {
        let v = files
            .binary_search(&PathBuf::from(rel))
            .expect("indexed above");
        if unread.contains(&files[v]) {
            continue;
        }
        let ix = &videos[v].1;
        let folder = format!("{name}.frames");
        for (n, (gop, pts)) in ix.frames().into_iter().enumerate() {
            for (kind, ext) in [(ViewKind::Npy, "npy"), (ViewKind::Ppm, "ppm")] {
                let size = crate::view::size(kind, ix.width, ix.height);
                b.file_in(
                    *dir,
                    &[&folder, &format!("{n:06}.{ext}")],
                    made.len() as u32,
                    size,
                );
                made.push(Made::Frame {
                    video: v as u32,
                    gop: gop as u32,
                    pts,
                    kind,
                });
            }
        }
    }
    let server = FrameServer::new(made, videos, decode.frame_cache_bytes, decode.threads)?;
    Ok((b.build(base), server))
}

/// Adds a LeRobot dataset's `frames/` (every row's frame, per camera and episode) and
/// `columns/` (each episode's features) to `b`, their made files to `made`; `files` are the
/// video files' paths from the root (sorted) and `videos` their indexes, in the same order.
fn episode_frames(
    ds: &lerobot::LeRobot,
    files: &[PathBuf],
    videos: &[(PathBuf, decoder::VideoIndex)],
    b: &mut tree::Builder,
    made: &mut Vec<Made>,
) {
    let mut missing = 0u64;
    for (ci, cam) in ds.cameras.iter().enumerate() {
        for e in &ds.episodes {
            let (rel, from) = &e.videos[ci];
            let v = files.binary_search(rel).expect("indexed above");
            let (path, ix) = &videos[v];
            let ep = format!("episode_{:06}", e.index);
            for &(fi, ts) in &e.rows {
                let t = from + ts;
                let found = ix.nearest(t);
                for (kind, ext) in [(ViewKind::Npy, "npy"), (ViewKind::Ppm, "ppm")] {
                    let m = match found {
                        Some((gop, pts, d)) if d < lerobot::TOLERANCE_S => Made::Frame {
                            video: v as u32,
                            gop: gop as u32,
                            pts,
                            kind,
                        },
                        _ => {
                            let why = format!(
                                "{}: no frame within {} s of {t:.6} s (episode {}, frame_index {fi}, {cam}){}",
                                path.display(),
                                lerobot::TOLERANCE_S,
                                e.index,
                                found.map_or(String::new(), |f| format!(
                                    "; the nearest is {:.6} s away",
                                    f.2
                                ))
                            );
                            if kind == ViewKind::Npy {
                                missing += 1;
                                if missing <= 10 {
                                    log::error!("{why}: its frame files answer EIO");
                                }
                            }
                            Made::Missing {
                                why: why.into(),
                                size: crate::view::size(kind, ix.width, ix.height),
                            }
                        }
                    };
                    let size = crate::view::size(kind, ix.width, ix.height);
                    b.file(
                        &["frames", cam, &ep, &format!("{fi:06}.{ext}")],
                        made.len() as u32,
                        size,
                    );
                    made.push(m);
                }
            }
        }
    }
    if missing > 10 {
        log::error!("{missing} rows in all have no frame within the tolerance");
    }
    for e in &ds.episodes {
        let ep = format!("episode_{:06}", e.index);
        for (c, values) in ds.columns.iter().zip(&e.values) {
            let bytes: Arc<[u8]> = lerobot::npy(c.descr, e.rows.len(), c.width, values).into();
            let name = format!("{}.npy", c.name);
            b.file(
                &["columns", &ep, &name],
                made.len() as u32,
                bytes.len() as u64,
            );
            made.push(Made::Bytes(bytes));
        }
    }
}
