//! Video datasets as frames (`loosefs mount DIR MNT --decode frames`): a LeRobot v3 dataset
//! ([`lerobot`]) gets, beside its own tree, `frames/<camera>/episode_<NNNNNN>/<frame_index
//! 06d>.npy` and `.ppm` (H×W×3 uint8: the frame LeRobot's decoders return for that row) and
//! `columns/episode_<NNNNNN>/<feature>.npy` (T×D, the feature's dtype, from the data files).
//!
//! - [`decoder`]: video files through FFmpeg's libraries, indexed without decoding, decoded a
//!   GOP at a time.
//! - [`frames`]: the server of the made files: GOPs decoded once, a bounded GOP cache, the
//!   next GOP decoded ahead.
//! - [`tree`]: the catalog that shows the made directories over the dataset's own tree.

pub mod decoder;
pub mod frames;
pub mod lerobot;
pub mod tree;

use crate::catalog::Catalog;
use crate::view::ViewKind;
use anyhow::{Context, Result};
use frames::{FrameServer, Made};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The frame tree of the LeRobot v3 dataset at `root` over `base` (the directory's own
/// catalog), and the server of its made files (`budget` bytes of decoded GOPs, `threads`
/// decode threads). Every video file is indexed (demuxed, not decoded) to choose each row's
/// frame; rows with no frame within [`lerobot::TOLERANCE_S`] are logged and answer EIO.
///
/// Errors: the dataset's metadata cannot be read ([`lerobot::LeRobot::open`]), a video file
/// cannot be indexed (names it), the decode threads cannot start.
pub fn lerobot_tree(
    root: &Path,
    base: Arc<dyn Catalog>,
    budget: u64,
    threads: usize,
) -> Result<(tree::FrameTree, Arc<FrameServer>)> {
    let ds = lerobot::LeRobot::open(root)?;
    let mut files: Vec<PathBuf> = (ds.episodes.iter())
        .flat_map(|e| e.videos.iter().map(|v| v.0.clone()))
        .collect();
    files.sort();
    files.dedup();
    let videos: Vec<(PathBuf, decoder::VideoIndex)> = files
        .par_iter()
        .map(|rel| {
            let p = root.join(rel);
            decoder::VideoIndex::of(&p)
                .with_context(|| format!("cannot index {}", p.display()))
                .map(|ix| (p, ix))
        })
        .collect::<Result<_>>()?;
    let mut made = Vec::new();
    let mut b = tree::Builder::default();
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
    let server = FrameServer::new(made, videos, budget, threads)?;
    Ok((b.build(base), server))
}
