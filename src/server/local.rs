//! A native pack served from its local file: the one place the router meets a concrete
//! catalog and storage.

use super::{Server, ServerOptions};
use crate::catalog::native::NativeCatalog;
use crate::format::reader::Pack;
use crate::storage::local::LocalStorage;
use crate::view::Views;
use std::sync::Arc;

impl Server {
    /// Serves a native pack from its local file, showing `views`. Errors: the pack's file
    /// handle cannot be duplicated.
    pub fn local(pack: Pack, views: Views, opts: ServerOptions) -> std::io::Result<Server> {
        let storage = Arc::new(LocalStorage::for_pack(&pack)?);
        Ok(Server::new(
            Arc::new(NativeCatalog::new(pack, views)),
            storage,
            opts,
        ))
    }
}
