//! Amazon S3 and S3-compatible servers (`s3://BUCKET/KEY`): endpoint (`--endpoint-url`,
//! `$AWS_ENDPOINT_URL_S3`, `$AWS_ENDPOINT_URL`, the profile's `endpoint_url`), region
//! (`--region`, `$AWS_REGION`, the profile's, else the bucket's as the server names it:
//! [`super::s3_region`]), Requester Pays (`--request-payer`), credentials from the
//! AWS chain ([`crate::storage::object::credentials`]) or none (`--no-sign-request`), listing by
//! `ListObjectsV2` pages.

use super::fail_fast::FailFast;
use super::s3_region::{Regional, Said};
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

/// The setting `key` of `profile` in the shared AWS config file: `$AWS_CONFIG_FILE` (default
/// `~/.aws/config`, sections `[profile name]`, or `[default]`), as the AWS CLI documents it
/// (`region`, `endpoint_url`). Its credentials are the credential chain's
/// ([`crate::storage::object::credentials`]).
fn profile_setting(profile: &str, key: &str) -> Option<String> {
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
        .get(key)
        .map(str::to_string)
}

/// The profile in use: `--profile`, else `$AWS_PROFILE` (`None`: `default`).
fn profile(args: &RemoteConfig) -> Option<String> {
    args.profile.clone().or_else(|| env("AWS_PROFILE"))
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
        let profile = profile(args);
        let region = args
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| profile_setting(profile.as_deref().unwrap_or("default"), "region"))
            .unwrap_or_else(|| "us-east-1".into());
        b = b.with_request_payer(args.request_payer);
        if args.no_sign_request {
            b = b.with_skip_signature(true);
        } else {
            b = b.with_credentials(Arc::new(crate::storage::object::credentials::Chain::new(
                profile,
            )));
        }
        let said = Arc::new(Said::default());
        let b = b
            .with_client_options(setup.client)
            .with_http_connector(FailFast::s3(said.clone()));
        let store = Arc::new(Regional::new(b, region, said, store)?);
        Ok((store.clone(), Lister::Pages(store)))
    }

    /// `--endpoint-url`, else as the AWS SDKs find a service's endpoint ("Service-specific
    /// endpoints", AWS SDKs and Tools Reference Guide): `$AWS_ENDPOINT_URL_S3`,
    /// `$AWS_ENDPOINT_URL`, the profile's `endpoint_url`; none of the last three when
    /// `$AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is true.
    fn endpoint(&self, _url: &str, args: &RemoteConfig) -> Option<(String, &'static str)> {
        if let Some(ep) = &args.endpoint_url {
            return Some((ep.clone(), "--endpoint-url"));
        }
        if env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return None;
        }
        env("AWS_ENDPOINT_URL_S3")
            .map(|ep| (ep, "$AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL").map(|ep| (ep, "$AWS_ENDPOINT_URL")))
            .or_else(|| {
                let p = profile(args);
                profile_setting(p.as_deref().unwrap_or("default"), "endpoint_url")
                    .map(|ep| (ep, "the profile's endpoint_url"))
            })
    }
}
