//! What a mount serves, composed once for every kind of source: the opened source
//! ([`crate::open::Opened`]: what it is) with the views the daemon decided, into one [`Fs`].
//!
//! | the source's files ([`Files`]) | composed over its catalog |
//! |---|---|
//! | packed | nothing: the catalog is served as it is |
//! | a local directory | the frame view (`--decode frames`, decoded from the directory) and the live changes (names changed while mounted, answered from the disk) |
//! | loose objects under a prefix | the frame view, decoded from copies out of the block cache ([`crate::video::spool`]) |
//!
//! Opening ([`crate::open`]) starts no thread: the frame view's decode pool starts here.

use crate::fs::changes::Changes;
use crate::fs::{Fs, FsOptions};
use crate::open::{Dataset, Files, Opened};
use crate::view::Views;
use anyhow::{Context, Result};
use std::sync::Arc;

/// The filesystem serving `opened` with `views` (as [`Dataset::views`] decided them; frames
/// decoded with `opts.decode`'s threads within its frame-cache budget).
///
/// Errors: the frame view cannot be made (no video, a damaged one, a copy that fails; names
/// the source).
pub fn compose(opened: Opened, views: Views, opts: FsOptions) -> Result<Fs> {
    let mut catalog = opened.catalog;
    let mut frames = None;
    if views.frames {
        let (tree, server) = match &opened.files {
            Files::Dir { root, .. } => crate::video::frame_tree(root, catalog, &opts.decode)
                .with_context(|| format!("cannot serve the frames of {}", root.display()))?,
            Files::Prefix {
                url,
                cache_root,
                index,
            } => crate::video::spool::frames_of_prefix(
                url,
                cache_root,
                &index[..],
                opened.storage.as_ref(),
                catalog,
                &opts.decode,
            )?,
            // Dataset::views refuses frames of every packed kind.
            Files::Packed => anyhow::bail!("frames of a packed source are not served"),
        };
        catalog = Arc::new(tree);
        frames = Some(server);
    }
    let changes = match opened.files {
        Files::Dir { root, raw, files } => Some(Changes::new(root, catalog.clone(), raw, files)),
        Files::Packed | Files::Prefix { .. } => None,
    };
    let mut fs = Fs::new(catalog, opened.storage, opts);
    if let Some(f) = frames {
        fs.set_frames(f);
    }
    if let Some(c) = changes {
        fs.set_changes(Arc::new(c));
    }
    Ok(fs)
}

/// The filesystem serving `ds` in process (tests and tools): the views it shows of `views`
/// ([`Dataset::views`]), opened ([`Dataset::opened`], chunks kept decompressed within
/// `chunk_cache` bytes) and composed ([`compose`]).
///
/// Errors: those of the three steps.
pub fn served(ds: Dataset, views: Views, opts: FsOptions, chunk_cache: u64) -> Result<Fs> {
    let views = ds.views(views)?;
    compose(ds.opened(views, chunk_cache)?, views, opts)
}

#[cfg(test)]
mod tests;
