//! Plain HTTP(S) servers (`https://HOST/PATH`, `http://HOST/PATH` with `--allow-http`): ranged
//! GETs of one URL each, prefixes listed through the server's directory pages
//! ([`crate::storage::object::http_listing`]), paths percent-encoded, read only.

use super::store::{Lister, Setup, Store, has_scheme};
use crate::storage::object::remote_config::RemoteConfig;
use anyhow::{Result, anyhow, bail};
use object_store::ObjectStore;
use object_store::client::HttpConnector;
use object_store::http::HttpBuilder;
use std::sync::Arc;

/// The HTTP(S) store.
pub(super) struct Http;

impl Store for Http {
    fn name(&self) -> &'static str {
        "HTTP"
    }

    fn forms(&self) -> &'static [&'static str] {
        &["https://HOST/PATH", "http://HOST/PATH"]
    }

    fn claims(&self, url: &str) -> bool {
        has_scheme(url, "https://") || has_scheme(url, "http://")
    }

    fn is_bucket(&self) -> bool {
        false
    }

    /// (`https://host:port`, path). Errors: no path after the host; a query string (`?…`), named
    /// without its text (a signature is a secret).
    fn split<'a>(&self, url: &'a str) -> Result<(&'a str, &'a str)> {
        if let Some((before, _)) = url.split_once('?') {
            bail!(
                "{before}?…: a URL with a query string (a presigned S3 URL, a GCS signed URL) \
                 cannot be mounted (each read is a request of its own, not of that URL); mount \
                 the object as s3:// or gs:// with credentials instead, or serve it without a \
                 query (an Azure URL with a SAS is taken as it is)"
            );
        }
        let start = url.find("://").map_or(0, |p| p + 3);
        let slash = url[start..]
            .find('/')
            .map(|p| p + start)
            .filter(|&p| p + 1 < url.len() && p > start)
            .ok_or_else(|| anyhow!("{url}: no object path after the host"))?;
        Ok((&url[..slash], &url[slash + 1..]))
    }

    fn build(
        &self,
        url: &str,
        origin: &str,
        setup: Setup<'_>,
    ) -> Result<(Arc<dyn ObjectStore>, Lister)> {
        super::store::plain_http(url, false, setup.args)?;
        let connector = crate::storage::object::fail_fast::FailFast::default;
        let dirs = crate::storage::object::http_listing::DirLister {
            client: connector().connect(&setup.client)?,
            retries: setup.retry.max_retries,
            retry_timeout: setup.retry.retry_timeout,
        };
        let store = HttpBuilder::new()
            .with_url(origin)
            .with_client_options(setup.client)
            .with_http_connector(connector())
            .with_retry(setup.retry)
            .build()?;
        Ok((Arc::new(store), Lister::Dirs(dirs)))
    }

    fn endpoint(&self, url: &str, _args: &RemoteConfig) -> Option<(String, &'static str)> {
        Some((url.to_string(), "the URL"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_url_is_refused_without_its_signature_in_the_message() {
        // reliability-probe.md, http-query-string-404: requested with `?` encoded into the path.
        let e = Http
            .split("https://h.example/b/data.pack?X-Amz-Signature=SECRET123&X-Amz-Expires=60")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("query string") && e.contains("https://h.example/b/data.pack"),
            "{e}"
        );
        assert!(!e.contains("SECRET123"), "{e}");
        assert_eq!(
            Http.split("https://h.example/b/data.pack").unwrap(),
            ("https://h.example", "b/data.pack")
        );
    }
}
