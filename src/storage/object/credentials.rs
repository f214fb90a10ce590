//! AWS credentials for S3, found by `aws-config`'s default chain (the AWS SDK's own, as the
//! AWS CLI finds them), in its order: the environment (`AWS_ACCESS_KEY_ID`, ...), the profile
//! (`--profile`, else `$AWS_PROFILE`, else `default`) in `~/.aws/credentials` and
//! `~/.aws/config` with keys, `credential_process`, SSO or `role_arn` (assumed through STS),
//! web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`), the container's endpoint (ECS, EKS pod
//! identity), then EC2 instance metadata unless `AWS_EC2_METADATA_DISABLED=true`.
//!
//! [`Chain`] is the `object_store` credential provider over it: the chain is built at the
//! first request (it is async), and its credentials are kept until five minutes before they
//! expire (`credential_process` runs its command once, not once per request). No credentials
//! anywhere fails that request at once (it is not retried), naming the sources tried.

use async_trait::async_trait;
use aws_credential_types::provider::ProvideCredentials;
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Credentials kept this long before they expire are fetched again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// How long finding credentials may take: a `credential_process` that never answers (an MFA
/// prompt with no terminal, a hung SSO helper) fails the request after this, saying so,
/// instead of hanging the mount for ever. STS, SSO and instance metadata answer in seconds.
pub(super) const FIND_TIMEOUT: Duration = Duration::from_secs(30);

/// `aws-config`'s default credential chain for one profile, with its answer kept.
#[derive(Debug)]
pub(super) struct Chain {
    profile: Option<String>,
    chain:
        tokio::sync::OnceCell<aws_config::default_provider::credentials::DefaultCredentialsChain>,
    kept: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl Chain {
    /// The chain for `profile` (`None`: `$AWS_PROFILE`, else `default`).
    pub(super) fn new(profile: Option<String>) -> Chain {
        Chain {
            profile,
            chain: tokio::sync::OnceCell::new(),
            kept: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl CredentialProvider for Chain {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut kept = self.kept.lock().await;
        if let Some((c, expiry)) = kept.as_ref()
            && expiry.is_none_or(|t| SystemTime::now() + REFRESH_BEFORE < t)
        {
            return Ok(c.clone());
        }
        let profile = self.profile.as_deref().unwrap_or("default");
        let find = async {
            let chain = (self.chain)
                .get_or_init(|| async {
                    let mut b =
                        aws_config::default_provider::credentials::DefaultCredentialsChain::builder(
                        );
                    if let Some(p) = &self.profile {
                        b = b.profile_name(p);
                    }
                    b.build().await
                })
                .await;
            chain.provide_credentials().await
        };
        let found = tokio::time::timeout(FIND_TIMEOUT, find).await;
        let found = found.map_err(|_| object_store::Error::Generic {
            store: "S3",
            source: format!(
                "no AWS credentials: finding them took more than {} s (profile {profile:?}: a \
                 credential_process or SSO helper that does not answer, waiting for a prompt?)",
                FIND_TIMEOUT.as_secs()
            )
            .into(),
        })?;
        let c = found.map_err(|e| {
            object_store::Error::Generic {
                store: "S3",
                source: format!(
                    "no AWS credentials: {} (tried, in order: the environment, profile {profile:?} in ~/.aws/credentials and ~/.aws/config (keys, credential_process, SSO, role_arn), web identity, the container's endpoint, instance metadata unless AWS_EC2_METADATA_DISABLED=true); use --profile, or --no-sign-request for a public bucket",
                    super::fail_fast::with_causes(&e)
                )
                .into(),
            }
        })?;
        let out = Arc::new(AwsCredential {
            key_id: c.access_key_id().to_string(),
            secret_key: c.secret_access_key().to_string(),
            token: c.session_token().map(str::to_string),
        });
        *kept = Some((out.clone(), c.expiry()));
        Ok(out)
    }
}
