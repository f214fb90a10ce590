//! Azure Blob Storage (`az://CONTAINER/KEY`, `abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/KEY`,
//! `https://ACCOUNT.blob.core.windows.net/CONTAINER/KEY`) through `object_store`'s Azure client:
//! the account and its credentials as Azure's tools find them — `$AZURE_STORAGE_CONNECTION_STRING`
//! (parsed here: `object_store` does not read it), the account key, a SAS token, a client secret,
//! workload identity, managed identity (`object_store`'s chain over `AZURE_*` variables) — or
//! Azurite (`$AZURE_STORAGE_USE_EMULATOR`, or `UseDevelopmentStorage=true`). Listed by pages
//! (`List Blobs`), GETs pinned to the blob's ETag.
//!
//! Own code over a crate for the connection string: its format is `Key=Value;…` (Microsoft,
//! "Configure Azure Storage connection strings"); the crates that parse it (azure_storage,
//! OpenDAL's) would bring a second Azure client for forty lines.

use super::store::{Lister, Setup, Store, bucket_and_key, bucket_and_key_after, env, has_scheme};
use crate::storage::object::remote_config::RemoteConfig;
use anyhow::{Result, anyhow, bail};
use object_store::ObjectStore;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use std::sync::Arc;

/// The Azure Blob store.
pub(super) struct Azure;

/// The schemes of Azure's own URL forms (fsspec's `az://`, Hadoop's `abfs[s]://`).
const SCHEMES: [&str; 4] = ["az://", "azure://", "abfs://", "abfss://"];

/// The host suffixes of an account's `https://` endpoints.
const HOSTS: [&str; 2] = [".blob.core.windows.net", ".dfs.core.windows.net"];

/// The account's endpoint Azurite answers when nothing else is said (object_store's default for
/// `AZURE_STORAGE_USE_EMULATOR`).
const AZURITE: &str = "http://127.0.0.1:10000";

/// The `https://ACCOUNT.blob.core.windows.net/` form's host, if `url` has it.
fn account_host(url: &str) -> Option<&str> {
    let rest = has_scheme(url, "https://").then(|| &url[8..])?;
    let host = rest.split('/').next()?;
    HOSTS
        .iter()
        .any(|h| host.len() > h.len() && host.to_ascii_lowercase().ends_with(h))
        .then_some(host)
}

/// What `$AZURE_STORAGE_CONNECTION_STRING` holds, as far as a blob client goes.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ConnectionString {
    pub account: Option<String>,
    pub key: Option<String>,
    pub sas: Option<String>,
    /// The blob service's URL (`BlobEndpoint`, else made from the protocol, account and
    /// `EndpointSuffix`).
    pub endpoint: Option<String>,
    /// `UseDevelopmentStorage=true`: Azurite at its well-known account.
    pub emulator: bool,
}

/// Parses a connection string: `Key=Value` pairs separated by `;` (values may hold `=`, as
/// account keys and SAS tokens do), names compared without case. Errors: a pair without `=`,
/// naming it (never its value: it may be a secret).
pub(super) fn parse_connection_string(s: &str) -> Result<ConnectionString> {
    let mut out = ConnectionString::default();
    let (mut protocol, mut suffix) = (None, None);
    for (i, pair) in s.split(';').enumerate() {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            anyhow!(
                "$AZURE_STORAGE_CONNECTION_STRING: part {} is not Name=Value",
                i + 1
            )
        })?;
        let v = v.trim().to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "accountname" => out.account = Some(v),
            "accountkey" => out.key = Some(v),
            "sharedaccesssignature" => out.sas = Some(v),
            "blobendpoint" => out.endpoint = Some(v),
            "defaultendpointsprotocol" => protocol = Some(v),
            "endpointsuffix" => suffix = Some(v),
            "usedevelopmentstorage" => out.emulator = v.eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    if out.endpoint.is_none() && !out.emulator {
        if let (Some(account), Some(suffix)) = (&out.account, &suffix) {
            let protocol = protocol.as_deref().unwrap_or("https");
            out.endpoint = Some(format!("{protocol}://{account}.blob.{suffix}"));
        }
    }
    Ok(out)
}

fn connection_string() -> Result<Option<ConnectionString>> {
    env("AZURE_STORAGE_CONNECTION_STRING")
        .map(|s| parse_connection_string(&s))
        .transpose()
}

/// Whether Azurite is asked for by the environment (`$AZURE_STORAGE_USE_EMULATOR`, as
/// `object_store` reads it).
fn emulator_env() -> bool {
    env("AZURE_STORAGE_USE_EMULATOR").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// `url` without the shared access signature in its query (`…/KEY?sv=…&sig=…`, as the
/// portal's "Generate SAS" gives it), and that signature: taken out where the command line is
/// read, so that the SAS travels by `$AZURE_STORAGE_SAS_TOKEN` and never appears in a
/// process's command line (the daemon's is world-readable), the mount table, a log or stats.
/// `None`: not an Azure URL, or no `sig=` in its query.
pub fn sas_out_of_url(url: &str) -> Option<(String, String)> {
    if !Azure.claims(url) {
        return None;
    }
    let (bare, query) = url.split_once('?')?;
    url::form_urlencoded::parse(query.as_bytes())
        .any(|(k, _)| k == "sig")
        .then(|| (bare.to_string(), query.to_string()))
}

impl Store for Azure {
    fn name(&self) -> &'static str {
        "Azure"
    }

    fn forms(&self) -> &'static [&'static str] {
        &[
            "az://CONTAINER/KEY",
            "abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/KEY",
            "https://ACCOUNT.blob.core.windows.net/CONTAINER/KEY",
        ]
    }

    fn claims(&self, url: &str) -> bool {
        SCHEMES.iter().any(|s| has_scheme(url, s)) || account_host(url).is_some()
    }

    fn is_bucket(&self) -> bool {
        true
    }

    /// The `https://` form is pasted from Azure's portal percent-encoded; the others hold the
    /// key as it is.
    fn encoded_keys(&self, url: &str) -> bool {
        account_host(url).is_some()
    }

    /// Azure answers a suffix range "not supported" (object_store refuses to send one).
    fn suffix_ranges(&self) -> bool {
        false
    }

    /// (`az://CONTAINER`, key), or (`https://ACCOUNT.blob.core.windows.net/CONTAINER`, key).
    fn split<'a>(&self, url: &'a str) -> Result<(&'a str, &'a str)> {
        let Some(host) = account_host(url) else {
            let form = match has_scheme(url, "abfs") {
                true => self.forms()[1],
                false => self.forms()[0],
            };
            return bucket_and_key(url, form);
        };
        bucket_and_key_after(url, "https://".len() + host.len() + 1, self.forms()[2])
    }

    fn build(
        &self,
        url: &str,
        store: &str,
        setup: Setup<'_>,
    ) -> Result<(Arc<dyn ObjectStore>, Lister)> {
        let args = setup.args;
        let mut client = setup.client;
        let mut b = MicrosoftAzureBuilder::from_env().with_retry(setup.retry);
        let cs = connection_string()?;
        let mut emulator = emulator_env();
        if let Some(cs) = &cs {
            if let Some(a) = &cs.account {
                b = b.with_account(a);
            }
            if let Some(k) = &cs.key {
                b = b.with_access_key(k);
            }
            if let Some(s) = &cs.sas {
                b = b.with_config(AzureConfigKey::SasKey, s);
            }
            emulator |= cs.emulator;
        }
        match self.endpoint(url, args) {
            Some((ep, option)) if option != "$AZURITE_BLOB_STORAGE_URL" => {
                // A connection string's plain http endpoint is the user's own configuration
                // (Azurite's well-known one is); --endpoint-url needs --allow-http.
                if super::store::plain_http(&ep, option != "--endpoint-url", args)? {
                    client = client.with_allow_http(true);
                }
                b = b
                    .with_endpoint(ep.trim_end_matches('/').to_string())
                    .with_use_emulator(false);
                if emulator && b.get_config_value(&AzureConfigKey::AccountName).is_none() {
                    b = b.with_account("devstoreaccount1");
                }
            }
            _ => b = b.with_use_emulator(emulator),
        }
        if args.no_sign_request {
            b = b.with_config(AzureConfigKey::SkipSignature, "true");
        }
        b = b.with_url(store);
        if account_host(url).is_none()
            && !emulator
            && b.get_config_value(&AzureConfigKey::AccountName).is_none()
        {
            bail!(
                "{url}: which Azure storage account? Give $AZURE_STORAGE_ACCOUNT_NAME, \
                 $AZURE_STORAGE_CONNECTION_STRING, or the URL as {}",
                self.forms()[2]
            );
        }
        if !emulator && !super::azure_credentials::configured(&b) {
            let account = b.get_config_value(&AzureConfigKey::AccountName);
            b = b.with_credentials(Arc::new(super::azure_credentials::Chain::new(
                account.as_deref().unwrap_or("account"),
            )));
        }
        let store = b
            .with_client_options(client)
            .with_http_connector(crate::storage::object::fail_fast::FailFast::default())
            .build()?;
        let store = Arc::new(store);
        Ok((store.clone(), Lister::Pages(store)))
    }

    fn endpoint(&self, _url: &str, args: &RemoteConfig) -> Option<(String, &'static str)> {
        if let Some(ep) = &args.endpoint_url {
            return Some((ep.clone(), "--endpoint-url"));
        }
        let cs = connection_string().ok().flatten();
        if let Some(ep) = cs.as_ref().and_then(|c| c.endpoint.clone()) {
            return Some((ep, "$AZURE_STORAGE_CONNECTION_STRING"));
        }
        (emulator_env() || cs.is_some_and(|c| c.emulator)).then(|| {
            let url = env("AZURITE_BLOB_STORAGE_URL").unwrap_or_else(|| AZURITE.to_string());
            (url, "$AZURITE_BLOB_STORAGE_URL")
        })
    }

    fn credentials_hint(&self, error: &str) -> Option<String> {
        // A configured source that failed (a client secret refused, a federated token file
        // gone): object_store's token request says which; the chain's own message names them
        // all ([`super::azure_credentials`]).
        (error.contains("microsoftazure")
            && error.contains("token request")
            && !error.contains("tried, in order"))
        .then(|| "Azure credentials refused".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_string_gives_account_credentials_and_endpoint() {
        let c = parse_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5==;EndpointSuffix=core.windows.net",
        )
        .unwrap();
        assert_eq!(c.account.as_deref(), Some("acct"));
        assert_eq!(c.key.as_deref(), Some("a2V5=="));
        assert_eq!(
            c.endpoint.as_deref(),
            Some("https://acct.blob.core.windows.net")
        );
        let c = parse_connection_string(
            "AccountName=devstoreaccount1;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=2020&sig=x%3D",
        )
        .unwrap();
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://127.0.0.1:10000/devstoreaccount1")
        );
        assert_eq!(c.sas.as_deref(), Some("sv=2020&sig=x%3D"));
        let c = parse_connection_string("UseDevelopmentStorage=true").unwrap();
        assert!(c.emulator && c.endpoint.is_none());
        let e = parse_connection_string("AccountName=a;secret")
            .unwrap_err()
            .to_string();
        assert!(e.contains("part 2") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn a_sas_in_the_url_is_taken_out_and_nothing_else() {
        let (bare, sas) =
            sas_out_of_url("https://a.blob.core.windows.net/c/k.pack?sv=2022-11-02&sp=r&sig=x%2By")
                .unwrap();
        assert_eq!(bare, "https://a.blob.core.windows.net/c/k.pack");
        assert_eq!(sas, "sv=2022-11-02&sp=r&sig=x%2By");
        assert_eq!(sas_out_of_url("az://c/k?sv=1&sig=z").unwrap().0, "az://c/k");
        assert_eq!(sas_out_of_url("az://c/k?x=1"), None);
        assert_eq!(sas_out_of_url("s3://b/k?sig=1"), None);
    }

    #[test]
    fn each_url_form_splits_at_its_container() {
        for (url, store, key) in [
            ("az://c/d/x.pack", "az://c", "d/x.pack"),
            (
                "abfss://c@acct.dfs.core.windows.net/x",
                "abfss://c@acct.dfs.core.windows.net",
                "x",
            ),
            (
                "https://acct.blob.core.windows.net/c/d/x%20y",
                "https://acct.blob.core.windows.net/c",
                "d/x%20y",
            ),
        ] {
            assert_eq!(Azure.split(url).unwrap(), (store, key), "{url}");
        }
        for (url, want) in [
            ("az://c", "az://CONTAINER/KEY"),
            ("abfs://c/", "abfss://CONTAINER@"),
            (
                "https://acct.blob.core.windows.net/c",
                "https://ACCOUNT.blob",
            ),
            (
                "https://acct.blob.core.windows.net/c/",
                "https://ACCOUNT.blob",
            ),
        ] {
            let e = Azure.split(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
        }
        assert!(Azure.encoded_keys("https://acct.blob.core.windows.net/c/k"));
        assert!(!Azure.encoded_keys("az://c/k"));
        assert!(!Azure.claims("https://blob.core.windows.net.evil/c/k"));
    }
}
