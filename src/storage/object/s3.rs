//! Amazon S3 and S3-compatible servers (`s3://BUCKET/KEY`): endpoint (`--endpoint-url`,
//! `$AWS_ENDPOINT_URL`), region (`--region`, `$AWS_REGION`, the profile's), credentials from the
//! AWS chain ([`crate::storage::object::credentials`]) or none (`--no-sign-request`), listing by
//! `ListObjectsV2` pages.

use super::store::{Lister, Setup, Store, bucket_and_key, env, has_scheme};
use crate::storage::object::remote_config::RemoteConfig;
use anyhow::Result;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use std::path::PathBuf;
use std::sync::Arc;

/// The S3 store.
pub(super) struct S3;

const SCHEME: &str = "s3://";

/// The region of `profile` in the shared AWS config file: `$AWS_CONFIG_FILE` (default
/// `~/.aws/config`, sections `[profile name]`, or `[default]`), as the AWS CLI documents it.
/// Its credentials are the credential chain's ([`crate::storage::object::credentials`]).
fn profile_region(profile: &str) -> Option<String> {
    let path = std::env::var_os("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws").join("config"))
        })?;
    let config = ini::Ini::load_from_file(path).ok()?;
    let section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    config
        .section(Some(section.as_str()))?
        .get("region")
        .map(str::to_string)
}

impl Store for S3 {
    fn name(&self) -> &'static str {
        "S3"
    }

    fn forms(&self) -> &'static [&'static str] {
        &["s3://BUCKET/KEY"]
    }

    fn claims(&self, url: &str) -> bool {
        has_scheme(url, SCHEME)
    }

    fn is_bucket(&self) -> bool {
        true
    }

    fn split<'a>(&self, url: &'a str) -> Result<(&'a str, &'a str)> {
        bucket_and_key(url, self.forms()[0])
    }

    fn build(
        &self,
        url: &str,
        store: &str,
        setup: Setup<'_>,
    ) -> Result<(Arc<dyn ObjectStore>, Lister)> {
        let args = setup.args;
        let bucket = &store[SCHEME.len()..];
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(setup.retry);
        if let Some((ep, _)) = self.endpoint(url, args) {
            // The client allows plain http with --allow-http already (`Setup::client`).
            super::store::plain_http(&ep, false, args)?;
            b = b.with_endpoint(ep);
        }
        let profile = args.profile.clone().or_else(|| env("AWS_PROFILE"));
        let region = args
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| profile_region(profile.as_deref().unwrap_or("default")))
            .unwrap_or_else(|| "us-east-1".into());
        b = b.with_region(region);
        if args.no_sign_request {
            b = b.with_skip_signature(true);
        } else {
            b = b.with_credentials(Arc::new(crate::storage::object::credentials::Chain::new(
                profile,
            )));
        }
        let store = b
            .with_client_options(setup.client)
            .with_http_connector(crate::storage::object::fail_fast::FailFast::default())
            .build()?;
        let store = Arc::new(store);
        Ok((store.clone(), Lister::Pages(store)))
    }

    fn endpoint(&self, _url: &str, args: &RemoteConfig) -> Option<(String, &'static str)> {
        match &args.endpoint_url {
            Some(ep) => Some((ep.clone(), "--endpoint-url")),
            None => env("AWS_ENDPOINT_URL").map(|ep| (ep, "$AWS_ENDPOINT_URL")),
        }
    }
}
