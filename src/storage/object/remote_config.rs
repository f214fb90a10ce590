//! How remote objects are reached and cached: the plain settings the object client, the
//! endpoint builder and the block cache read (the CLI's `RemoteArgs` converts into this once;
//! no command-line type crosses below it).

use std::path::PathBuf;

/// GETs in flight at most, by default.
pub const DEFAULT_MAX_REQUESTS: usize = 16;
/// Retries of a failed GET at most, by default (as many as fit in the retry time).
pub const DEFAULT_RETRIES: usize = 1000;
/// Time spent retrying a GET before an outage is declared, by default, seconds.
pub const DEFAULT_RETRY_TIMEOUT: u64 = 120;
/// Time limit of one GET, by default, seconds.
pub const DEFAULT_REQUEST_TIMEOUT: u64 = 60;

/// How `s3://`, `gs://`, `az://` and `https://` objects are reached and cached. [`Default`] gives the CLI's
/// defaults (the `DEFAULT_*` constants; AWS endpoints).
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// S3 endpoint of an S3-compatible store (`None`: AWS, or `$AWS_ENDPOINT_URL`).
    pub endpoint_url: Option<String>,
    /// S3 region signed for first (`None`: `$AWS_REGION`, the profile's region, else
    /// us-east-1); the server's answer corrects it ([`super::s3_region`]).
    pub region: Option<String>,
    /// S3 Requester Pays: `x-amz-request-payer: requester` on every request.
    pub request_payer: bool,
    /// GCS Requester Pays: the project billed (`x-goog-user-project`).
    pub billing_project: Option<String>,
    /// Send unsigned requests (public buckets); no credentials are looked up.
    pub no_sign_request: bool,
    /// Profile of the shared AWS files (`None`: `$AWS_PROFILE`, else `default`).
    pub profile: Option<String>,
    /// Allow plain `http://` URLs and endpoints.
    pub allow_http: bool,
    /// PEM file of extra CA certificates to trust for https (`None`: `$AWS_CA_BUNDLE`).
    pub ca_bundle: Option<PathBuf>,
    /// Root of the local block cache (`None`: `blocks/` under [`crate::storage::cache_root`]).
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache root holds (`None`: what it holds now plus the free space of its
    /// file system, less a reserve).
    pub cache_size: Option<u64>,
    /// Concurrent GETs at most.
    pub max_requests: usize,
    /// Most retries of a failed GET.
    pub retries: usize,
    /// Longest time spent retrying one GET, seconds.
    pub retry_timeout: u64,
    /// Time limit of one GET, seconds.
    pub request_timeout: u64,
    /// Open from a complete block cache without any request.
    pub offline: bool,
}

impl Default for RemoteConfig {
    fn default() -> RemoteConfig {
        RemoteConfig {
            endpoint_url: None,
            region: None,
            request_payer: false,
            billing_project: None,
            no_sign_request: false,
            profile: None,
            allow_http: false,
            ca_bundle: None,
            cache_dir: None,
            cache_size: None,
            max_requests: DEFAULT_MAX_REQUESTS,
            retries: DEFAULT_RETRIES,
            retry_timeout: DEFAULT_RETRY_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            offline: false,
        }
    }
}
