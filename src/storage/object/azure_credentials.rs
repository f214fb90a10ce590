//! Azure credentials found as Azure's own SDKs find them (`DefaultAzureCredential`, Azure
//! Identity client library: environment, workload identity, managed identity, Azure CLI), in
//! that order:
//!
//! 1. the environment, read by `object_store` itself: `$AZURE_STORAGE_CONNECTION_STRING`'s key
//!    or SAS, `$AZURE_STORAGE_ACCOUNT_KEY`, `$AZURE_STORAGE_SAS_TOKEN` (or a SAS in the URL),
//!    a client secret (`$AZURE_CLIENT_ID`, `$AZURE_CLIENT_SECRET`, `$AZURE_TENANT_ID`);
//! 2. workload identity (`$AZURE_FEDERATED_TOKEN_FILE` with `$AZURE_CLIENT_ID` and
//!    `$AZURE_TENANT_ID`, as AKS injects them), read by `object_store`;
//! 3. managed identity (the instance metadata endpoint, `$AZURE_MSI_ENDPOINT` else
//!    169.254.169.254), tried once with a short timeout: a VM without one does not answer;
//! 4. the Azure CLI's login (`az login`), when `az` is on `PATH`: no flag needed (object_store
//!    asks for `$AZURE_USE_AZURE_CLI=true`, which still forces it first).
//!
//! Own code here: the order past the environment ([`Chain`]). `object_store` builds one
//! provider from the configuration (managed identity when nothing is configured, retried for
//! `--retry-timeout` on a VM that has none: 2 minutes before the mount failed) and takes the
//! Azure CLI only when told; the Azure SDK for Rust's `azure_identity` would bring a second HTTP
//! stack and Azure client for this one decision. The providers themselves are `object_store`'s.

use async_trait::async_trait;
use object_store::azure::{AzureConfigKey, AzureCredential, MicrosoftAzureBuilder};
use object_store::{ClientOptions, CredentialProvider, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// How long the managed identity endpoint may take to answer: Azure's SDKs probe it with a
/// one-second timeout on first use ("IMDS probe", Azure Identity's ManagedIdentityCredential).
const MANAGED_IDENTITY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `az account get-access-token` may take (it may refresh its token over the network).
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `b` (from the environment and the connection string) holds a credential of the
/// environment or workload identity, or is told to use the CLI or no signature: then
/// `object_store` chooses, and [`Chain`] is not used.
pub(super) fn configured(b: &MicrosoftAzureBuilder) -> bool {
    use AzureConfigKey as K;
    let has = |k: K| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    let yes = |k: K| {
        b.get_config_value(&k)
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    };
    has(K::AccessKey)
        || has(K::SasKey)
        || has(K::Token)
        || (has(K::ClientId)
            && has(K::AuthorityId)
            && (has(K::ClientSecret) || has(K::FederatedTokenFile)))
        || has(K::CredentialType)
        || yes(K::UseAzureCli)
        || yes(K::SkipSignature)
        || yes(K::UseEmulator)
}

/// Where the managed identity endpoint is asked.
fn managed_identity_endpoint() -> String {
    super::store::env("AZURE_MSI_ENDPOINT")
        .or_else(|| super::store::env("MSI_ENDPOINT"))
        .unwrap_or_else(|| "http://169.254.169.254/metadata/identity/oauth2/token".to_string())
}

/// Whether `az` is an executable file in one of `$PATH`'s directories.
fn cli_installed() -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join("az"))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Managed identity, then the Azure CLI, each `object_store`'s provider; the first that gives a
/// token is kept for the mount's life (it refreshes its own token).
#[derive(Debug)]
pub(super) struct Chain {
    account: String,
    chosen: tokio::sync::OnceCell<Arc<dyn CredentialProvider<Credential = AzureCredential>>>,
}

impl Chain {
    /// The chain for `account`. Nothing is requested.
    pub(super) fn new(account: &str) -> Chain {
        Chain {
            account: account.to_string(),
            chosen: tokio::sync::OnceCell::new(),
        }
    }

    /// `object_store`'s provider for the configuration `b` adds to the bare account: retried
    /// once at most, quickly.
    fn provider(
        &self,
        cli: bool,
    ) -> object_store::Result<Arc<dyn CredentialProvider<Credential = AzureCredential>>> {
        let options = ClientOptions::new()
            .with_connect_timeout(MANAGED_IDENTITY_TIMEOUT)
            .with_timeout(MANAGED_IDENTITY_TIMEOUT);
        let retry = RetryConfig {
            max_retries: 0,
            retry_timeout: MANAGED_IDENTITY_TIMEOUT,
            ..RetryConfig::default()
        };
        let mut b = MicrosoftAzureBuilder::new()
            .with_account(&self.account)
            .with_container_name("credentials")
            .with_client_options(options)
            .with_retry(retry)
            .with_use_azure_cli(cli);
        for (k, v) in [
            (
                AzureConfigKey::MsiEndpoint,
                super::store::env("AZURE_MSI_ENDPOINT"),
            ),
            (
                AzureConfigKey::ClientId,
                super::store::env("AZURE_CLIENT_ID"),
            ),
            (
                AzureConfigKey::MsiResourceId,
                super::store::env("AZURE_MSI_RESOURCE_ID"),
            ),
            (
                AzureConfigKey::ObjectId,
                super::store::env("AZURE_OBJECT_ID"),
            ),
        ] {
            if let Some(v) = v {
                b = b.with_config(k, v);
            }
        }
        Ok(b.build()?.credentials().clone())
    }

    async fn choose(
        &self,
    ) -> object_store::Result<Arc<dyn CredentialProvider<Credential = AzureCredential>>> {
        let mi = self.provider(false)?;
        let why_mi =
            match tokio::time::timeout(MANAGED_IDENTITY_TIMEOUT * 2, mi.get_credential()).await {
                Ok(Ok(_)) => return Ok(mi),
                Ok(Err(e)) => super::fail_fast::last_causes(&e, 1),
                Err(_) => "no answer".to_string(),
            };
        let why_cli = if cli_installed() {
            let cli = self.provider(true)?;
            match tokio::time::timeout(CLI_TIMEOUT, cli.get_credential()).await {
                Ok(Ok(_)) => return Ok(cli),
                Ok(Err(e)) => format!("{} (run `az login`)", super::fail_fast::last_causes(&e, 1)),
                Err(_) => format!("no answer within {} s", CLI_TIMEOUT.as_secs()),
            }
        } else {
            "`az` is not on PATH".to_string()
        };
        Err(object_store::Error::Generic {
            store: "MicrosoftAzure",
            source: format!(
                "no Azure credentials (tried, in order: the environment \
                 ($AZURE_STORAGE_CONNECTION_STRING, $AZURE_STORAGE_ACCOUNT_KEY, \
                 $AZURE_STORAGE_SAS_TOKEN or a SAS in the URL, $AZURE_CLIENT_ID with \
                 $AZURE_CLIENT_SECRET and $AZURE_TENANT_ID): none set; workload identity \
                 ($AZURE_FEDERATED_TOKEN_FILE): not set; managed identity at {}: {why_mi}; the \
                 Azure CLI: {why_cli}); use --no-sign-request for a public container",
                managed_identity_endpoint()
            )
            .into(),
        })
    }
}

#[async_trait]
impl CredentialProvider for Chain {
    type Credential = AzureCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AzureCredential>> {
        let chosen = self.chosen.get_or_try_init(|| self.choose()).await?;
        chosen.get_credential().await
    }
}
