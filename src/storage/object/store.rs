//! The object stores loosefs reads, one file each beside this one ([`super::s3`],
//! [`super::gcs`], [`super::azure`], [`super::http`]), and the registry that says which store
//! a URL names. A URL is claimed by exactly one store, asked in the order of [`STORES`]; every
//! difference between stores (URL forms, where the bucket ends and the key begins, how keys are
//! encoded, whether prefixes are listed page by page, the client and its credentials, the
//! endpoint to probe) is a method of [`Store`], never a test of a scheme string elsewhere (a
//! test, `scheme_strings_live_in_the_store_files`, holds the code to it).
//!
//! Adding a store (DESIGN "Adding an object store"): a file beside this one implementing
//! [`Store`], and its line in [`STORES`].

use super::remote_config::RemoteConfig;
use anyhow::Result;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use std::sync::Arc;

/// One kind of object store, as far as a URL and its client go. Implementations are stateless
/// (one `static` each); nothing here sends a request.
pub(super) trait Store: Sync {
    /// The store's name in messages ("S3", "GCS").
    fn name(&self) -> &'static str;

    /// The URL forms it takes, as said in messages (`s3://BUCKET/KEY`).
    fn forms(&self) -> &'static [&'static str];

    /// Whether `url` is one of this store's (schemes compared without case).
    fn claims(&self, url: &str) -> bool;

    /// A bucket store: its prefixes are listed page by page, its keys are held in a URL as
    /// they are (not percent-encoded), and indexes and packs can be written to it. `false`:
    /// read only, listed by directory pages, paths percent-encoded (HTTP).
    fn is_bucket(&self) -> bool;

    /// Whether keys in `url` are percent-encoded (decoded once into the object's key). Default:
    /// not for a bucket store.
    fn encoded_keys(&self, _url: &str) -> bool {
        !self.is_bucket()
    }

    /// Whether a GET may ask for the last N bytes of an object without knowing its size (an
    /// HTTP suffix range, `bytes=-N`). Default: yes; Azure Blob: no.
    fn suffix_ranges(&self) -> bool {
        true
    }

    /// `url` split where the store (bucket, container, or host) ends and the key begins:
    /// (store part, key), the key not empty. Errors: malformed, naming the form to give.
    fn split<'a>(&self, url: &'a str) -> Result<(&'a str, &'a str)>;

    /// The client of the store part `store` of `url` (from [`Store::split`]), and how its
    /// prefixes are listed. Nothing is requested. Errors: the client cannot be set up (a
    /// plain http endpoint without `--allow-http`, bad credentials configuration).
    fn build(
        &self,
        url: &str,
        store: &str,
        setup: Setup<'_>,
    ) -> Result<(Arc<dyn ObjectStore>, Lister)>;

    /// Where requests for `url` go when that is not the store's own cloud service, and the
    /// option or variable that said so: the host the preflight probes. `None`: the cloud's
    /// own endpoint (not probed).
    fn endpoint(&self, url: &str, args: &RemoteConfig) -> Option<(String, &'static str)>;

    /// What to say about a failed request whose error (its causes joined, lower case) is
    /// `error`, when it is this store's credentials that are missing: the sources tried and
    /// the option that fixes it.
    fn credentials_hint(&self, _error: &str) -> Option<String> {
        None
    }
}

/// What every store's client is built with: the options ([`RemoteConfig`]), the HTTP client
/// options (timeouts, CA bundle, plain http allowed) and the retry policy.
pub(super) struct Setup<'a> {
    pub args: &'a RemoteConfig,
    pub client: ClientOptions,
    pub retry: RetryConfig,
}

/// The one rule every store follows for a plain `http://` endpoint or URL `ep`: bytes (and
/// credentials) travel unencrypted, so it needs `--allow-http`, unless the user's own
/// configuration named it (`trusted`: an emulator's variable, a connection string). Returns
/// whether `ep` is plain http (the client must then allow it). Errors: plain http without
/// either, naming `ep`.
pub(super) fn plain_http(ep: &str, trusted: bool, args: &RemoteConfig) -> Result<bool> {
    let http = has_scheme(ep, "http://");
    if http && !trusted && !args.allow_http {
        anyhow::bail!("{ep}: plain http needs --allow-http (bytes travel unencrypted)");
    }
    Ok(http)
}

/// Whether `url` starts with `scheme` (`s3://`), compared without case, with more after it.
pub(super) fn has_scheme(url: &str, scheme: &str) -> bool {
    url.len() > scheme.len()
        && url.is_char_boundary(scheme.len())
        && url[..scheme.len()].eq_ignore_ascii_case(scheme)
}

/// `SCHEME://BUCKET/KEY` split at the bucket: (`SCHEME://BUCKET`, key). Errors: no bucket or
/// no key, naming `form`.
pub(super) fn bucket_and_key<'a>(url: &'a str, form: &str) -> Result<(&'a str, &'a str)> {
    bucket_and_key_after(url, url.find("://").map_or(0, |p| p + 3), form)
}

/// `url` split at the bucket (or container) that starts at byte `start` and ends at the next
/// `/`: (`url` up to the bucket's end, key), as path-style `https://HOST/BUCKET/KEY` URLs need.
/// Errors: no bucket or no key, naming `form`.
pub(super) fn bucket_and_key_after<'a>(
    url: &'a str,
    start: usize,
    form: &str,
) -> Result<(&'a str, &'a str)> {
    url.get(start..)
        .unwrap_or("")
        .split_once('/')
        .filter(|(b, k)| !b.is_empty() && !k.is_empty())
        .map(|(b, k)| (&url[..start + b.len()], k))
        .ok_or_else(|| anyhow::anyhow!("{url}: give {form}"))
}

/// `$name`, unless unset or empty.
pub(super) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A store that lists one page per request (S3's `ListObjectsV2`).
pub(super) type Pages = Arc<dyn object_store::list::PaginatedListStore>;

/// How a store's prefixes are listed.
#[derive(Clone)]
pub(super) enum Lister {
    /// An object store's paginated LIST (S3).
    Pages(Pages),
    /// An HTTP server's directory listings, one level per GET.
    Dirs(super::http_listing::DirLister),
}
