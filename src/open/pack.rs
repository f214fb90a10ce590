//! A native loosefs pack in a local file: opened by its trailer and index
//! ([`crate::pack::reader::Pack`]), served from the file through the page cache and leased
//! while mounted. A file that is not a pack is handed to the foreign formats' detection.

use super::{Dataset, OpenOptions, Opened};
use crate::catalog::native::NativeCatalog;
use crate::formats::ScanOptions;
use crate::pack::FormatError;
use crate::pack::reader::Pack;
use crate::view::Views;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;

/// Opens the file `src` (no `--format` given): a native pack, else a dataset in another format
/// whose detection names the file and what is wrong, the pack's own reason among those tried.
/// A zip cut short (a truncated pack is one) says why it is not a pack either; a zip whose
/// central directory names the pack index is a pack with a damaged trailer: refused, not
/// served as a zip.
///
/// Errors: a damaged pack, a file in no known format, a damaged foreign file.
pub(super) fn open(
    src: &Path,
    opts: &OpenOptions,
    scan: &ScanOptions,
    progress: crate::progress::Progress,
) -> Result<Dataset> {
    let why = match Pack::open(src) {
        Ok(p) => return Ok(Dataset::Pack(p)),
        Err(FormatError::NotAPack(why)) => why,
        Err(e) => return Err(e).with_context(|| format!("cannot open pack {}", src.display())),
    };
    let format = match crate::formats::detect(src) {
        // The formats tried, each with its reason, the pack among them.
        Err(e) => {
            return Err(crate::exit_code::joined(
                e,
                format!("\n  loosefs pack: {why}"),
            ));
        }
        Ok(f) => f,
    };
    let why = format!("{}: not a loosefs pack ({why})", src.display());
    let (names_index, whole) = match format {
        crate::formats::Format::Zip => zip_end(src),
        _ => (false, true),
    };
    if names_index {
        return Err(crate::exit_code::refuse(
            crate::exit_code::ExitKind::Damaged,
            format!(
                "{why}; it holds a pack index ({}): a loosefs pack whose end is damaged. Pack \
                 the source again",
                crate::pack::INDEX_MEMBER
            ),
        ));
    }
    let r = crate::formats::index::open(src, scan, opts.index_dir.as_deref(), progress)
        .map(Dataset::Foreign);
    if whole { r } else { r.context(why) }
}

/// What the filesystem needs to serve `pack`, showing `views`; its file is leased while
/// mounted. Errors: the pack's file handle cannot be duplicated or its metadata read.
pub(super) fn opened(pack: Pack, views: Views) -> Result<Opened> {
    let lease = pack.file().try_clone()?;
    let owner = super::metadata(pack.path())?;
    let storage = Arc::new(pack.storage()?);
    Ok(Opened {
        catalog: Arc::new(NativeCatalog::new(pack, views)),
        storage,
        owner,
        lease: Some(lease),
        files: crate::open::Files::Packed,
    })
}

/// The last 64 KiB of `src` (less when it is shorter; empty when it cannot be read).
fn tail_of(src: &Path) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = Vec::new();
    if let Ok(mut f) = std::fs::File::open(src) {
        let _ = f
            .seek(SeekFrom::End(-(64 << 10)))
            .or_else(|_| f.seek(SeekFrom::Start(0)));
        let _ = f.take(64 << 10).read_to_end(&mut tail);
    }
    tail
}

/// What the end of a zip says it is: `(names the pack index, has an end of central directory)`.
/// The pack index is the last entry of a pack's central directory, so a zip naming it is a pack
/// whose trailer is damaged; a zip without an end record is cut short (perhaps a pack).
fn zip_end(src: &Path) -> (bool, bool) {
    let tail = tail_of(src);
    let has = |name: &[u8]| tail.windows(name.len()).any(|w| w == name);
    (
        has(crate::pack::INDEX_MEMBER.as_bytes()),
        has(b"PK\x05\x06"),
    )
}
