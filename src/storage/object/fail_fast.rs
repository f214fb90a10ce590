//! Failures no retry can heal, told apart from those that may heal. `object_store` retries
//! every connect error alike until `--retry-timeout`: an untrusted TLS certificate cost
//! 2 min 7 s of retries and dozens of log lines before its cause was said. The
//! [`FailFast`] connector wraps `object_store`'s own reqwest connector and marks a TLS
//! certificate failure as not retryable (`HttpErrorKind::Unknown`, which `object_store`'s
//! retry loop and [`super::http_listing`]'s pass through at once). A refused connection or a
//! DNS failure stays retryable here: mid-epoch it is a server restarting or a network outage,
//! which `--retry-timeout` rides out; before the first request [`super::endpoints`]'s
//! preflight already fails fast on them.
//!
//! Listing pages pass through [`super::list_pages`] on their way to `object_store`'s parser.

use super::s3_region::Said;
use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use std::sync::Arc;

/// What to do about a refused certificate, said after the error.
pub(crate) const CERTIFICATE_FIX: &str = "the server's TLS certificate is not trusted: give the \
     CA that signed it with --ca-bundle FILE.pem or $AWS_CA_BUNDLE";

/// An [`HttpConnector`]: `object_store`'s reqwest client, with a TLS certificate failure
/// answered as permanent (not retried).
#[derive(Debug, Default)]
pub(crate) struct FailFast {
    inner: ReqwestConnector,
    gcs_emulator: bool,
    s3_region: Option<Arc<Said>>,
}

impl FailFast {
    /// The connector of a GCS emulator: requests take its JSON API
    /// ([`super::gcs_emulator`]).
    pub(crate) fn gcs_emulator() -> FailFast {
        FailFast {
            gcs_emulator: true,
            ..FailFast::default()
        }
    }

    /// The connector of an S3 client: a wrong-region answer's region is noted in `said`
    /// ([`super::s3_region`]).
    pub(crate) fn s3(said: Arc<Said>) -> FailFast {
        FailFast {
            s3_region: Some(said),
            ..FailFast::default()
        }
    }
}

impl HttpConnector for FailFast {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Service {
            client: self.inner.connect(options)?,
            gcs_emulator: self.gcs_emulator,
            s3_region: self.s3_region.clone(),
        }))
    }
}

#[derive(Debug)]
struct Service {
    client: HttpClient,
    gcs_emulator: bool,
    s3_region: Option<Arc<Said>>,
}

#[async_trait]
impl HttpService for Service {
    async fn call(&self, mut req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let listing = super::list_pages::list_request(req.uri());
        let json_listing = self.gcs_emulator && super::gcs_emulator::to_json_api(&mut req);
        let resp = self.client.execute(req).await.map_err(|e| {
            if is_permanent(&e) {
                HttpError::new(HttpErrorKind::Unknown, Permanent(e))
            } else {
                e
            }
        })?;
        let status = resp.status().as_u16();
        if let Some(said) = &self.s3_region
            && matches!(status, 301 | 307 | 400)
        {
            let header = resp.headers().get("x-amz-bucket-region");
            if let Some(r) = header.and_then(|h| h.to_str().ok()) {
                said.note(status, Some(r), None);
            } else {
                // An error document (a few hundred bytes): read to find its <Region>, then
                // passed on whole.
                let (parts, body) = resp.into_parts();
                let body = body.bytes().await?;
                said.note(status, None, Some(&body));
                return Ok(HttpResponse::from_parts(parts, body.into()));
            }
        }
        match listing {
            Some((dialect, asked)) if resp.status().is_success() => {
                // A listing page: read whole (at most 1000 entries) and tidied for the parser.
                let (parts, body) = resp.into_parts();
                let mut body = body.bytes().await?;
                if json_listing {
                    body = super::gcs_emulator::listing_to_xml(&body)
                        .map_err(|why| {
                            HttpError::new(HttpErrorKind::Unknown, std::io::Error::other(why))
                        })?
                        .into();
                }
                let body = match super::list_pages::tidy(&body, dialect, asked.as_deref()) {
                    Ok(None) => body,
                    Ok(Some(tidied)) => tidied.into(),
                    Err(why) => {
                        return Err(HttpError::new(
                            HttpErrorKind::Unknown,
                            std::io::Error::other(why),
                        ));
                    }
                };
                Ok(HttpResponse::from_parts(parts, body.into()))
            }
            _ => Ok(resp),
        }
    }
}

/// `HttpError` `0`, seen through: its cause's message and causes, so that wrapping it again
/// (as not retryable) does not say "HTTP error" twice.
#[derive(Debug)]
struct Permanent(HttpError);

impl std::fmt::Display for Permanent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::error::Error;
        match self.0.source() {
            Some(cause) => write!(f, "{cause}"),
            None => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for Permanent {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source().and_then(|cause| cause.source())
    }
}

/// Whether `e` is a failure retrying cannot heal: the server's TLS certificate was refused
/// (an unknown issuer, an expired certificate, another host's name, none presented).
pub(crate) fn is_permanent(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if is_certificate(c) {
            return true;
        }
        // An io::Error's `source()` skips the error it wraps (rustls's, under one io::Error
        // from tokio-rustls and another from hyper-rustls): follow what it wraps instead.
        cur = match c.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as _),
            None => c.source(),
        };
    }
    false
}

/// `e` and the causes under it, joined by `: ` (a TLS or connection failure, or why no
/// credential provider answered, names itself only in a cause).
pub(crate) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut s = e.source();
    while let Some(c) = s {
        parts.push(c.to_string());
        s = c.source();
    }
    parts.join(": ")
}

/// The last `n` causes of `e`, joined by `: ` (credential libraries repeat themselves at every
/// level, "but future attempts may succeed"; what happened is at the bottom: a refused
/// connection, a server's answer, a command's words).
pub(crate) fn last_causes(e: &(dyn std::error::Error + 'static), n: usize) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        parts.push(c.to_string());
        cur = c.source();
    }
    parts[parts.len().saturating_sub(n.max(1))..].join(": ")
}

fn is_certificate(e: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::Error as T;
    matches!(
        e.downcast_ref::<T>(),
        Some(
            T::InvalidCertificate(_)
                | T::NoCertificatesPresented
                | T::InvalidCertRevocationList(_)
                | T::UnsupportedNameType
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_permanent_even_wrapped_in_io_errors_and_a_refusal_is_not() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
        let http = HttpError::new(HttpErrorKind::Connect, io);
        assert!(is_permanent(&http));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_permanent(&HttpError::new(
            HttpErrorKind::Connect,
            refused
        )));
    }
}
