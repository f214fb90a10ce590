//! A native pack served from its local file: the one place the router meets a concrete
//! catalog and storage.

use super::{Fs, FsOptions};
use crate::catalog::native::NativeCatalog;
use crate::pack::reader::Pack;
use crate::view::Views;
use std::sync::Arc;

impl Fs {
    /// Serves a native pack from its local file, showing `views`. Errors: the pack's file
    /// handle cannot be duplicated.
    pub fn local(pack: Pack, views: Views, opts: FsOptions) -> std::io::Result<Fs> {
        let storage = Arc::new(pack.storage()?);
        Ok(Fs::new(
            Arc::new(NativeCatalog::new(pack, views)),
            storage,
            opts,
        ))
    }
}
