//! An S3 bucket's region, found from the server as the AWS SDKs find it. Requests are signed
//! for a region (SigV4's credential scope); S3 refuses a request signed for another region than
//! the bucket's and says which one it is: the `x-amz-bucket-region` header of a `301
//! PermanentRedirect` or `400 AuthorizationHeaderMalformed` answer, and the error document's
//! `<Region>` (AWS, "Making requests", "Troubleshooting: AuthorizationHeaderMalformed"; boto3's
//! `S3RegionRedirector` and the Rust SDK do the same). [`Regional`] is the S3 store that, on
//! such an answer, builds its client again for that region, keeps it for every later request,
//! says so once, and asks again: a bucket in eu-west-3 reads with no `--region`, costing one
//! refused request per client. A region given (`--region`, `$AWS_REGION`, the profile's) is
//! tried first and corrected the same way.
//!
//! Own code: `object_store`'s `resolve_bucket_region` asks AWS's own host only (no endpoint,
//! so no S3-compatible server), and its client does not follow a wrong-region answer.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::list::{PaginatedListOptions, PaginatedListResult, PaginatedListStore};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::sync::{Arc, Mutex};

/// The region the server last named for the bucket, written by the HTTP layer
/// ([`super::fail_fast`]) and read by [`Regional`].
#[derive(Debug, Default)]
pub(crate) struct Said(Mutex<Option<String>>);

impl Said {
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes the region an answer of status `status` names (`header`: its
    /// `x-amz-bucket-region`; `body`: its error document, if read), when it is a wrong-region
    /// answer (301, 307 or 400).
    pub(crate) fn note(&self, status: u16, header: Option<&str>, body: Option<&[u8]>) {
        if !matches!(status, 301 | 307 | 400) {
            return;
        }
        let region = header.map(str::to_string).or_else(|| {
            let text = std::str::from_utf8(body?).ok()?;
            let from = text.find("<Region>")? + "<Region>".len();
            let to = text[from..].find("</Region>")? + from;
            Some(text[from..to].trim().to_string())
        });
        if let Some(r) = region.filter(|r| valid(r)) {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        }
    }
}

/// A region's name as AWS spells them (`eu-west-3`, `us-gov-west-1`, `cn-north-1`): lower-case
/// letters, digits and dashes, nothing a server could slip into a host name.
fn valid(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 32
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The S3 store of one bucket, following the server to the bucket's region. Every method
/// `AmazonS3` implements itself is passed on (a default of the trait would cost requests:
/// `list_with_offset`'s lists from the start).
#[derive(Debug)]
pub(crate) struct Regional {
    builder: AmazonS3Builder,
    said: Arc<Said>,
    /// The bucket as messages name it (the store part of its URLs).
    bucket: String,
    current: Mutex<(String, Arc<AmazonS3>)>,
}

impl Regional {
    /// The store built by `builder` for `region`; `said` is the slot its HTTP connector writes;
    /// `bucket` names it in messages (the store part of its URLs).
    /// Errors: `object_store`'s, building the client.
    pub(crate) fn new(
        builder: AmazonS3Builder,
        region: String,
        said: Arc<Said>,
        bucket: &str,
    ) -> Result<Regional> {
        let store = Arc::new(builder.clone().with_region(&region).build()?);
        Ok(Regional {
            builder,
            said,
            bucket: bucket.to_string(),
            current: Mutex::new((region, store)),
        })
    }

    fn current(&self) -> Arc<AmazonS3> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// After a failed request: the client for the region the server named, if it named one
    /// other than the current (built once and kept). `None`: the failure is not the region's.
    fn moved(&self) -> Option<Arc<AmazonS3>> {
        let region = self.said.get()?;
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if cur.0 == region {
            // Another request moved already, or the server names the region signed for.
            return None;
        }
        let store = Arc::new(self.builder.clone().with_region(&region).build().ok()?);
        log::warn!(
            "{}: the bucket is in region {region}, not {}: requests are signed for {region} \
             from now on (give --region {region} to skip the refused request)",
            self.bucket,
            cur.0
        );
        *cur = (region, store.clone());
        Some(store)
    }

    /// Runs `op` on the current client, and once more on the bucket's region's when the server
    /// refused it for the region.
    async fn retried<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: Fn(Arc<AmazonS3>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let before = self.current();
        match op(before.clone()).await {
            Err(e) => match self.moved().or_else(|| {
                let now = self.current();
                (!Arc::ptr_eq(&now, &before)).then_some(now)
            }) {
                Some(store) => op(store).await,
                None => Err(e),
            },
            ok => ok,
        }
    }
}

impl std::fmt::Display for Regional {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.current())
    }
}

#[async_trait]
impl ObjectStore for Regional {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.retried(|s| {
            let (payload, opts) = (payload.clone(), opts.clone());
            async move { s.put_opts(location, payload, opts).await }
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.retried(|s| {
            let opts = opts.clone();
            async move { s.put_multipart_opts(location, opts).await }
        })
        .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.retried(|s| {
            let options = options.clone();
            async move { s.get_opts(location, options).await }
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.current().delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.current().list(prefix)
    }

    /// S3's own (`start-after`): the trait's default lists from the start and filters.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.current().list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.retried(|s| async move { s.list_with_delimiter(prefix).await })
            .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.retried(|s| {
            let options = options.clone();
            async move { s.copy_opts(from, to, options).await }
        })
        .await
    }
}

#[async_trait]
impl PaginatedListStore for Regional {
    async fn list_paginated(
        &self,
        prefix: Option<&str>,
        opts: PaginatedListOptions,
    ) -> Result<PaginatedListResult> {
        self.retried(|s| {
            let opts = opts.clone();
            async move { s.list_paginated(prefix, opts).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_region_answer_names_the_bucket_region_and_nothing_else_does() {
        let said = Said::default();
        said.note(200, Some("eu-west-1"), None);
        said.note(403, Some("eu-west-1"), None);
        assert_eq!(said.get(), None);
        let doc =
            b"<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' \
            is wrong; expecting 'eu-west-3'</Message><Region>eu-west-3</Region></Error>";
        said.note(400, None, Some(doc));
        assert_eq!(said.get().as_deref(), Some("eu-west-3"));
        said.note(301, Some("ap-south-1"), None);
        assert_eq!(said.get().as_deref(), Some("ap-south-1"));
        said.note(301, Some("evil.example.com/"), None);
        assert_eq!(said.get().as_deref(), Some("ap-south-1"));
    }
}
