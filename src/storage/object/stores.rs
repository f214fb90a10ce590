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

use super::super::endpoints::Lister;
use super::super::remote_config::RemoteConfig;
use anyhow::Result;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use std::sync::Arc;

/// One kind of object store, as far as a URL and its client go. Implementations are stateless
/// (one `static` each); nothing here sends a request.
pub(in crate::storage) trait Store: Sync {
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
pub(in crate::storage) struct Setup<'a> {
    pub args: &'a RemoteConfig,
    pub client: ClientOptions,
    pub retry: RetryConfig,
}

/// Every store, asked in this order: Azure's `https://ACCOUNT.blob.core.windows.net/` URLs
/// before plain HTTP(S).
pub(in crate::storage) static STORES: [&dyn Store; 4] = [
    &super::s3::S3,
    &super::gcs::Gcs,
    &super::azure::Azure,
    &super::http::Http,
];

/// The store `url` names, if any.
pub(in crate::storage) fn store_of(url: &str) -> Option<&'static dyn Store> {
    STORES.iter().copied().find(|s| s.claims(url))
}

/// Whether `url` starts with `scheme` (`s3://`), compared without case, with more after it.
pub(in crate::storage) fn has_scheme(url: &str, scheme: &str) -> bool {
    url.len() > scheme.len()
        && url.is_char_boundary(scheme.len())
        && url[..scheme.len()].eq_ignore_ascii_case(scheme)
}

/// Every URL form loosefs reads, for messages: "s3://BUCKET/KEY, gs://BUCKET/KEY, …".
pub(in crate::storage) fn all_forms() -> String {
    forms_of(|_| true)
}

/// The URL forms indexes and packs can be written to (bucket stores), for messages.
pub(in crate::storage) fn bucket_forms() -> String {
    forms_of(|s| s.is_bucket())
}

fn forms_of(keep: impl Fn(&dyn Store) -> bool) -> String {
    STORES
        .iter()
        .filter(|s| keep(**s))
        .flat_map(|s| s.forms().iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `SCHEME://BUCKET/KEY` split at the bucket: (`SCHEME://BUCKET`, key). Errors: no bucket or
/// no key, naming `form`.
pub(in crate::storage) fn bucket_and_key<'a>(
    url: &'a str,
    form: &str,
) -> Result<(&'a str, &'a str)> {
    let start = url.find("://").map_or(0, |p| p + 3);
    url[start..]
        .split_once('/')
        .filter(|(b, k)| !b.is_empty() && !k.is_empty())
        .map(|(b, k)| (&url[..start + b.len()], k))
        .ok_or_else(|| anyhow::anyhow!("{url}: give {form}"))
}

/// `$name`, unless unset or empty.
pub(in crate::storage) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_url_has_one_store() {
        for (url, name) in [
            ("s3://b/k", "S3"),
            ("S3://b/k", "S3"),
            ("gs://b/k", "GCS"),
            ("az://c/k", "Azure"),
            ("abfss://c@acct.dfs.core.windows.net/k", "Azure"),
            ("https://acct.blob.core.windows.net/c/k", "Azure"),
            ("https://h/k", "HTTP"),
            ("http://h/k", "HTTP"),
        ] {
            let claimed: Vec<_> = STORES.iter().filter(|s| s.claims(url)).collect();
            assert!(!claimed.is_empty(), "{url}");
            assert_eq!(store_of(url).unwrap().name(), name, "{url}");
        }
        for not in ["/data/x", "ftp://h/x", "s3://", "gs:/b/k", "é"] {
            assert!(store_of(not).is_none(), "{not}");
        }
    }

    /// The scheme strings of the stores appear in their own files only (outside tests and
    /// comments): elsewhere, code asks the store ([`store_of`]) what the URL is.
    #[test]
    fn scheme_strings_live_in_the_store_files() {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let own = ["s3.rs", "gcs.rs", "azure.rs", "http.rs", "stores.rs"];
        let schemes = ["s3://", "gs://", "az://", "abfs", "azure://", "windows.net"];
        let mut found = Vec::new();
        let mut stack = vec![here.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    if !p.ends_with("tests") {
                        stack.push(p);
                    }
                    continue;
                }
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                let in_object = p.parent().is_some_and(|d| d.ends_with("storage/object"));
                if !name.ends_with(".rs")
                    || name == "tests.rs"
                    || (in_object && own.contains(&name.as_str()))
                {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (n, line) in lines.iter().enumerate() {
                    // An inline test module ends the code (a `mod tests;` line does not).
                    let next = lines.get(n + 1).map_or("", |l| l.trim_end());
                    if line.trim_start() == "#[cfg(test)]"
                        && next.ends_with('{')
                        && next.contains("mod ")
                    {
                        break;
                    }
                    if line.trim_start().starts_with("//") {
                        continue;
                    }
                    if schemes
                        .iter()
                        .any(|s| line.to_ascii_lowercase().contains(s))
                    {
                        found.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "scheme strings outside the store files:\n{}",
            found.join("\n")
        );
    }
}
