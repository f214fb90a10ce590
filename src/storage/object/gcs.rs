//! Google Cloud Storage (`gs://BUCKET/KEY`, and `https://storage.googleapis.com/BUCKET/KEY` as
//! the console's "public URL" and `gsutil` give it) through `object_store`'s GCS client (its XML API):
//! credentials as Google's tools find them, an emulator at `$STORAGE_EMULATOR_HOST` as Google's
//! client libraries reach one (its JSON API: [`super::gcs_emulator`]), listing by pages, GETs pinned to the object's generation.

use super::store::{Lister, Setup, Store, bucket_and_key, bucket_and_key_after, env, has_scheme};
use crate::storage::object::remote_config::RemoteConfig;
use anyhow::Result;
use object_store::gcp::{GcpCredential, GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::{ObjectStore, StaticCredentialProvider};
use std::sync::Arc;

/// The GCS store.
pub(super) struct Gcs;

const SCHEME: &str = "gs://";

/// Google's hosts whose `https://` URLs name `BUCKET/KEY` (path style).
const HOSTS: [&str; 2] = ["storage.googleapis.com", "storage.cloud.google.com"];

/// The length of `https://HOST/` when `url` is a path-style URL of Google's hosts.
fn https_form(url: &str) -> Option<usize> {
    HOSTS.iter().find_map(|h| {
        let head = format!("https://{h}/");
        has_scheme(url, &head).then_some(head.len())
    })
}

/// Where a GCS client sends its requests instead of Google's: `--endpoint-url`, else
/// `$STORAGE_EMULATOR_HOST` (`host:port` or a URL), as Google's client libraries read it for
/// an emulator; and whether that is the emulator. `None`: storage.googleapis.com.
fn gcs_endpoint(args: &RemoteConfig) -> Option<(String, bool)> {
    if let Some(ep) = &args.endpoint_url {
        return Some((ep.clone(), false));
    }
    let host = env("STORAGE_EMULATOR_HOST")?;
    let url = match host.contains("://") {
        true => host,
        false => format!("http://{host}"),
    };
    Some((url, true))
}

impl Store for Gcs {
    fn name(&self) -> &'static str {
        "GCS"
    }

    fn forms(&self) -> &'static [&'static str] {
        &[
            "gs://BUCKET/KEY",
            "https://storage.googleapis.com/BUCKET/KEY",
        ]
    }

    fn claims(&self, url: &str) -> bool {
        has_scheme(url, SCHEME) || https_form(url).is_some()
    }

    /// The `https://` form is a URL: its path percent-encoded.
    fn encoded_keys(&self, url: &str) -> bool {
        https_form(url).is_some()
    }

    fn is_bucket(&self) -> bool {
        true
    }

    /// (`gs://BUCKET` or `https://storage.googleapis.com/BUCKET`, key).
    fn split<'a>(&self, url: &'a str) -> Result<(&'a str, &'a str)> {
        let Some(head) = https_form(url) else {
            return bucket_and_key(url, self.forms()[0]);
        };
        bucket_and_key_after(url, head, self.forms()[1])
    }

    /// The GCS client of the bucket: credentials as Google's tools find them
    /// ([`super::gcs_credentials`]), none with `--no-sign-request` or for an emulator
    /// (`$STORAGE_EMULATOR_HOST`, which takes plain http as Google's libraries do).
    fn build(
        &self,
        _url: &str,
        store: &str,
        setup: Setup<'_>,
    ) -> Result<(Arc<dyn ObjectStore>, Lister)> {
        let args = setup.args;
        let mut b = GoogleCloudStorageBuilder::from_env()
            .with_bucket_name(&store[https_form(store).unwrap_or(SCHEME.len())..])
            .with_retry(setup.retry);
        let mut client = setup.client;
        if let Some(project) = &args.billing_project {
            let mut headers = http::HeaderMap::new();
            let value = http::HeaderValue::from_str(project).map_err(|_| {
                anyhow::anyhow!("--billing-project {project:?}: not a Google Cloud project id")
            })?;
            headers.insert("x-goog-user-project", value);
            client = client.with_default_headers(headers);
        }
        let anonymous = args.no_sign_request;
        let mut on_emulator = false;
        if let Some((ep, emulator)) = gcs_endpoint(args) {
            if super::store::plain_http(&ep, emulator, args)? {
                client = client.with_allow_http(true);
            }
            on_emulator = emulator;
            b = b.with_config(GoogleConfigKey::BaseUrl, ep.trim_end_matches('/'));
        }
        if anonymous {
            b = b.with_config(GoogleConfigKey::SkipSignature, "true");
        } else if on_emulator {
            // An emulator takes any token. Not SkipSignature: object_store 0.14's uploads ask
            // the credential chain whatever it says (the metadata server, then a failure).
            let token = GcpCredential {
                bearer: "emulator".into(),
            };
            b = b.with_credentials(Arc::new(StaticCredentialProvider::new(token)));
        } else if !super::gcs_credentials::object_store_account() {
            b = b.with_credentials(Arc::new(super::gcs_credentials::Chain::default()));
        }
        let connector = match on_emulator {
            true => crate::storage::object::fail_fast::FailFast::gcs_emulator(),
            false => crate::storage::object::fail_fast::FailFast::default(),
        };
        let store = b
            .with_client_options(client)
            .with_http_connector(connector)
            .build()?;
        let store = Arc::new(store);
        Ok((store.clone(), Lister::Pages(store)))
    }

    fn endpoint(&self, _url: &str, args: &RemoteConfig) -> Option<(String, &'static str)> {
        gcs_endpoint(args).map(|(ep, emulator)| match emulator {
            true => (ep, "$STORAGE_EMULATOR_HOST"),
            false => (ep, "--endpoint-url"),
        })
    }

    fn credentials_hint(&self, error: &str) -> Option<String> {
        // object_store's GCS chain ends at the metadata server: say what was looked for.
        (error.contains("gcs") && error.contains("token request")).then(|| {
            "no GCS credentials (tried, in order: $GOOGLE_SERVICE_ACCOUNT / \
             $GOOGLE_APPLICATION_CREDENTIALS, the gcloud ADC file \
             ~/.config/gcloud/application_default_credentials.json, the metadata server); use \
             --no-sign-request for a public bucket, or $STORAGE_EMULATOR_HOST for an emulator"
                .to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_url_forms_split_at_the_bucket() {
        assert_eq!(
            Gcs.split("gs://b/d/x.pack").unwrap(),
            ("gs://b", "d/x.pack")
        );
        let u = "https://storage.googleapis.com/b/d/x%20y.pack";
        assert_eq!(
            Gcs.split(u).unwrap(),
            ("https://storage.googleapis.com/b", "d/x%20y.pack")
        );
        assert!(Gcs.encoded_keys(u) && !Gcs.encoded_keys("gs://b/k"));
        let e = Gcs.split("https://storage.googleapis.com/b").unwrap_err();
        assert!(
            e.to_string()
                .contains("give https://storage.googleapis.com/BUCKET/KEY")
        );
        assert!(!Gcs.claims("https://storage.googleapis.com.evil/b/k"));
    }
}
