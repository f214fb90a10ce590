//! GCS credentials found as Google's client libraries find them: Application Default
//! Credentials (Google, AIP-4110 "Application Default Credentials"), through Google's own
//! `google-cloud-auth` crate, in its order:
//!
//! 1. `$GOOGLE_APPLICATION_CREDENTIALS`, a JSON file of any type Google's libraries take: a
//!    service account key, an authorized user, `external_account` (Workload Identity
//!    Federation: a subject token from a file, a URL, a command or AWS, exchanged at Google's
//!    STS and optionally impersonated), `impersonated_service_account`,
//!    `external_account_authorized_user`;
//! 2. gcloud's ADC file, `~/.config/gcloud/application_default_credentials.json` (written by
//!    `gcloud auth application-default login`, with or without `--impersonate-service-account`);
//! 3. the metadata server (`$GCE_METADATA_HOST`, else `metadata.google.internal`): GCE, GKE
//!    Workload Identity, Cloud Run.
//!
//! `object_store`'s own variables (`$GOOGLE_SERVICE_ACCOUNT`, `…_PATH`, `…_KEY`: the key's JSON
//! itself, as a Kubernetes Secret gives it) come first, read by `object_store` itself.
//!
//! Own code here is the adapter to `object_store` ([`Chain`]) and the message that names each
//! source in the order tried; the chain is Google's. A metadata server that does not answer
//! is not waited for: Google's libraries try it once (no retry loop of `--retry-timeout`, as
//! `object_store`'s metadata client had: 179 requests over 120 s), and [`FIND_TIMEOUT`]
//! bounds the whole search.

use async_trait::async_trait;
use google_cloud_auth::credentials::{AccessTokenCredentials, Builder};
use object_store::CredentialProvider;
use object_store::gcp::GcpCredential;
use std::sync::Arc;
use std::time::Duration;

/// How long finding a token may take before the request fails naming the sources: Google's
/// libraries give a metadata server about a second per attempt; a token exchange (STS,
/// impersonation) answers in well under this.
pub(super) const FIND_TIMEOUT: Duration = Duration::from_secs(8);

/// How long the metadata server may take when it is the only source left (no credentials file
/// anywhere): google-auth's default (`GCE_METADATA_TIMEOUT`, 3 s), which that variable sets
/// here too. A metadata server answers in milliseconds; one that does not is not there.
fn metadata_timeout() -> Duration {
    super::store::env("GCE_METADATA_TIMEOUT")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(3), Duration::from_secs)
        .min(FIND_TIMEOUT)
}

/// Whether Google's chain has nothing to go on but the metadata server: no
/// `$GOOGLE_APPLICATION_CREDENTIALS`, no gcloud ADC file.
fn metadata_only() -> bool {
    std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_none()
        && !std::env::var_os("HOME").is_some_and(|h| {
            std::path::Path::new(&h)
                .join(".config/gcloud/application_default_credentials.json")
                .exists()
        })
}

/// The variables `object_store` reads a service account from by itself (they come first).
pub(super) const OBJECT_STORE_VARIABLES: [&str; 3] = [
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
];

/// Whether one of `object_store`'s own service-account variables is set (then `object_store`
/// reads it, and [`Chain`] is not used).
pub(super) fn object_store_account() -> bool {
    OBJECT_STORE_VARIABLES
        .iter()
        .any(|v| super::store::env(v).is_some())
}

/// Where Google's chain looks, in its order, for the "no GCS credentials" message.
pub(super) fn sources_tried() -> String {
    let adc = match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        Some(p) => format!("$GOOGLE_APPLICATION_CREDENTIALS ({})", p.to_string_lossy()),
        None => "$GOOGLE_APPLICATION_CREDENTIALS (not set)".to_string(),
    };
    let metadata = super::store::env("GCE_METADATA_HOST")
        .unwrap_or_else(|| "metadata.google.internal".to_string());
    format!(
        "tried, in order: ${} (not set), {adc}, gcloud's ADC file \
         ~/.config/gcloud/application_default_credentials.json (from `gcloud auth \
         application-default login`), the metadata server at {metadata}",
        OBJECT_STORE_VARIABLES.join(" / $")
    )
}

/// `object_store`'s credential provider over Google's ADC chain; tokens are cached and
/// refreshed before they expire by `google-cloud-auth` itself.
/// The chain is built at the first request (its token cache runs on the runtime).
#[derive(Debug, Default)]
pub(super) struct Chain {
    creds: tokio::sync::OnceCell<AccessTokenCredentials>,
}

/// The chain as the environment and gcloud's file configure it. Errors: a credentials file
/// that does not exist, cannot be read or is not a credential Google's libraries take, naming
/// the file (never its contents: it may hold a key).
fn build() -> object_store::Result<AccessTokenCredentials> {
    Builder::default()
        .build_access_token_credentials()
        .map_err(|e| object_store::Error::Generic {
            store: "GCS",
            source: format!(
                "GCS credentials: {} (from {})",
                super::fail_fast::with_causes(&e),
                std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").map_or_else(
                    || {
                        "gcloud's ADC file ~/.config/gcloud/application_default_credentials.json"
                            .to_string()
                    },
                    |p| format!("$GOOGLE_APPLICATION_CREDENTIALS {}", p.to_string_lossy())
                )
            )
            .into(),
        })
}

fn no_credentials(why: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "GCS",
        source: format!(
            "no GCS credentials: {why} ({}); use --no-sign-request for a public bucket, or \
             $STORAGE_EMULATOR_HOST for an emulator",
            sources_tried()
        )
        .into(),
    }
}

#[async_trait]
impl CredentialProvider for Chain {
    type Credential = GcpCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<GcpCredential>> {
        let creds = self.creds.get_or_try_init(|| async { build() }).await?;
        let (limit, what) = match metadata_only() {
            true => (metadata_timeout(), "the metadata server"),
            false => (FIND_TIMEOUT, "the credentials' token exchange"),
        };
        let token = tokio::time::timeout(limit, creds.access_token())
            .await
            .map_err(|_| no_credentials(format!("{what}: no answer within {} s", limit.as_secs())))?
            .map_err(|e| no_credentials(super::fail_fast::last_causes(&e, 2)))?;
        Ok(Arc::new(GcpCredential {
            bearer: token.token,
        }))
    }
}
