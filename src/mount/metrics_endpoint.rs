//! `--metrics-addr`: the mount's statistics served over HTTP for a Prometheus server to scrape,
//! by the `tiny_http` crate on one thread of the daemon. `GET /metrics` answers the same text
//! as `loosefs stats --format prometheus` (text format 0.0.4), or OpenMetrics 1.0 when the
//! request's `Accept` header names `application/openmetrics-text` (what Prometheus asks for
//! first); any other path answers 404, any other method 405. Each answer is a fresh report.

use crate::fs::Fs;
use anyhow::{Result, anyhow};
use std::net::SocketAddr;
use std::sync::Arc;
use tiny_http::{Header, Method, Response, Server};

/// Prometheus text format 0.0.4's content type.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics 1.0's content type.
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A bound metrics endpoint, not yet answering: binding comes before the mount, so that an
/// address in use fails the mount command instead of a daemon that already serves files.
pub(super) struct Endpoint {
    server: Server,
    addr: SocketAddr,
}

impl Endpoint {
    /// Binds `addr` (port 0 takes a free port; [`Endpoint::addr`] tells which). Errors name
    /// the flag and the address (in use, not this machine's, no permission).
    pub(super) fn bind(addr: SocketAddr) -> Result<Endpoint> {
        let server = Server::http(addr).map_err(|e| anyhow!("--metrics-addr {addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| anyhow!("--metrics-addr {addr}: not an IP address"))?;
        Ok(Endpoint { server, addr })
    }

    /// The address it listens on.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers requests on a thread of its own until the process ends, each with a report of
    /// `fs` labelled with `mountpoint`.
    pub(super) fn serve(self, fs: Arc<Fs>, mountpoint: String) -> Result<()> {
        std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || {
                for req in self.server.incoming_requests() {
                    let om = accepts_openmetrics(req.headers());
                    let (status, kind, body) = answer(req.method(), req.url(), om, |om| {
                        let r = fs.report();
                        match om {
                            true => crate::metrics::openmetrics(&r, &mountpoint),
                            false => crate::metrics::prometheus(&r, &mountpoint),
                        }
                    });
                    let header = Header::from_bytes("Content-Type", kind).expect("ASCII header");
                    let resp = Response::from_string(body)
                        .with_status_code(status)
                        .with_header(header);
                    if let Err(e) = req.respond(resp) {
                        log::debug!("metrics endpoint: answering a scrape: {e}");
                    }
                }
            })?;
        Ok(())
    }
}

/// Whether an `Accept` header asks for OpenMetrics.
fn accepts_openmetrics(headers: &[Header]) -> bool {
    headers.iter().any(|h| {
        h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
    })
}

/// The status, content type and body answering `method` on `url`; `render(openmetrics)` makes
/// the metrics' text.
fn answer(
    method: &Method,
    url: &str,
    openmetrics: bool,
    render: impl FnOnce(bool) -> String,
) -> (u16, &'static str, String) {
    let path = url.split('?').next().unwrap_or(url);
    if path != "/metrics" {
        return (404, "text/plain", "not found: GET /metrics\n".into());
    }
    if *method != Method::Get && *method != Method::Head {
        return (
            405,
            "text/plain",
            "method not allowed: GET /metrics\n".into(),
        );
    }
    let kind = if openmetrics {
        OPENMETRICS_TEXT
    } else {
        PROMETHEUS_TEXT
    };
    (200, kind, render(openmetrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(om: bool) -> String {
        format!("openmetrics={om}")
    }

    #[test]
    fn metrics_answers_prometheus_text_or_openmetrics_as_asked() {
        let got = answer(&Method::Get, "/metrics", false, render);
        assert_eq!(got, (200, PROMETHEUS_TEXT, "openmetrics=false".into()));
        let got = answer(&Method::Get, "/metrics?x=1", true, render);
        assert_eq!(got, (200, OPENMETRICS_TEXT, "openmetrics=true".into()));
        let h = Header::from_bytes(
            "accept",
            "application/openmetrics-text;version=1.0.0,*/*;q=0.1",
        );
        assert!(accepts_openmetrics(&[h.unwrap()]));
        assert!(!accepts_openmetrics(&[
            Header::from_bytes("Accept", "*/*").unwrap()
        ]));
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        assert_eq!(answer(&Method::Get, "/", false, render).0, 404);
        assert_eq!(answer(&Method::Post, "/metrics", false, render).0, 405);
    }

    #[test]
    fn an_address_in_use_names_the_flag() {
        let first = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let e = Endpoint::bind(first.addr()).err().unwrap().to_string();
        assert!(
            e.starts_with(&format!("--metrics-addr {}", first.addr())),
            "{e}"
        );
    }
}
