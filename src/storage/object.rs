//! Remote objects: everything about reaching a bucket, container or HTTP server, one idea per
//! file below, behind the two seams the rest of loosefs sees ([`source::ObjectSource`], one
//! object pinned to a version; [`source::ObjectStore`], objects by URL, listing, upload).
//! This file is the folder's face: the factory ([`connect`]), the network's store
//! ([`Remote`]), and ETag comparison.
//!
//! | file | idea |
//! |---|---|
//! | `client.rs` | one object's client: ranged GETs pinned to the ETag (`If-Match`), request permits, outages, fetch and upload |
//! | `errors.rs` | a store's failures said in words, and their `io::ErrorKind` |
//! | `store.rs`, `stores.rs`, `s3.rs`, `gcs.rs`, `azure.rs`, `http.rs` | what a kind of store is, and the registry of them |
//! | `credentials.rs`, `gcs_credentials.rs`, `azure_credentials.rs` | each cloud's credential chain, in its SDKs' order |
//! | `s3_region.rs`, `gcs_emulator.rs` | an S3 bucket's region from the server; a GCS emulator through its JSON API |
//! | `endpoints.rs`, `fail_fast.rs`, `remote_config.rs` | URLs, the preflight and fast failures, the options |
//! | `list.rs`, `list_pages.rs`, `http_listing.rs` | listings: bucket pages checked, HTTP directories |
//! | `set.rs`, `end_to_end.rs` | several objects as one storage |
//! | `source.rs`, `fake.rs` | the seams, and their in-memory fake for tests |

use anyhow::Result;
use std::sync::Arc;

use remote_config::RemoteConfig;
pub use source::{Level, Listed, ObjectError, ObjectStats, Pin};

mod azure;
mod azure_credentials;
mod client;
mod credentials;
pub mod end_to_end;
mod endpoints;
mod errors;
mod fail_fast;
#[cfg(test)]
pub mod fake;
mod gcs;
mod gcs_credentials;
mod gcs_emulator;
mod http;
pub mod http_listing;
mod list;
mod list_pages;
pub mod remote_config;
mod s3;
mod s3_region;
pub mod set;
pub mod source;
mod store;
pub(crate) mod stores;
pub use azure::sas_out_of_url;
pub use client::{ObjectClient, PERMITS_PER_REQUEST, SMALL_GET, permits};
pub use endpoints::{bucket_forms, is_bucket_url, is_url, url_below};
pub use errors::error_kind;
pub use list::LISTS_AT_ONCE;

/// The object store that `config` reaches (every store of [`stores::STORES`], through
/// [`Remote`]): what the openers of remote sources get, as the trait they take. Nothing is
/// requested yet.
pub fn connect(config: remote_config::RemoteConfig) -> Arc<dyn source::ObjectStore> {
    Remote::new(config)
}

/// Whether two ETags name the same version: their opaque tags compared, with or without the
/// quotes RFC 9110 (§8.8.3) puts around them and a weak `W/` prefix (a listing may give
/// `abc==` where the object's answer gives `"abc=="`: fake-gcs-server's XML listing).
pub fn same_etag(a: &str, b: &str) -> bool {
    fn opaque(e: &str) -> &str {
        let e = e.strip_prefix("W/").unwrap_or(e);
        e.strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .unwrap_or(e)
    }
    opaque(a) == opaque(b)
}

/// `etag` as an entity tag: quoted as RFC 9110 writes it (`abc` -> `"abc"`), as it goes into
/// an `If-Match` header; already quoted or weak, as it is.
pub fn quoted_etag(etag: &str) -> String {
    if etag.is_empty() || etag.starts_with('"') || etag.starts_with("W/") {
        etag.to_string()
    } else {
        format!("\"{etag}\"")
    }
}

/// The S3 buckets and HTTPS hosts one [`RemoteConfig`] reaches, as an
/// [`ObjectStore`](source::ObjectStore): the openers' way to the network.
/// Objects on the bucket or host of the first one asked for share its runtime, connection
/// pool, request limit and outage state ([`ObjectClient::sibling`]); others get their own
/// client.
#[derive(Debug)]
pub struct Remote {
    config: RemoteConfig,
    first: std::sync::Mutex<Option<Arc<ObjectClient>>>,
}

impl Remote {
    /// The store reached with `config`. Nothing is requested yet.
    pub fn new(config: RemoteConfig) -> Arc<Remote> {
        Arc::new(Remote {
            config,
            first: std::sync::Mutex::new(None),
        })
    }

    /// A client of `url`: a sibling of the first client when on its bucket or host.
    fn client(&self, url: &str) -> Result<ObjectClient> {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = first.as_ref() {
            if let Ok(c) = f.sibling(url) {
                return Ok(c);
            }
            return ObjectClient::new(url, &self.config);
        }
        let c = Arc::new(ObjectClient::new(url, &self.config)?);
        *first = Some(c.clone());
        c.sibling(url)
    }
}

impl source::ObjectStore for Remote {
    fn object(&self, url: &str) -> Result<Arc<dyn source::ObjectSource>> {
        Ok(Arc::new(self.client(url)?))
    }

    fn list(&self, url: &str) -> Result<Vec<Listed>> {
        self.client(url)?.list()
    }

    fn list_level(&self, url: &str) -> Result<Level> {
        self.client(url)?.list_level()
    }

    fn list_below(
        &self,
        url: &str,
        level: Level,
        progress: crate::progress::Progress,
    ) -> Result<Vec<Listed>> {
        self.client(url)?.list_below(level, progress)
    }

    fn upload(&self, url: &str, src: &std::path::Path) -> Result<()> {
        self.client(url)?.upload(src)
    }
}
