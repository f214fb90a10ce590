//! `--metrics-addr`: the mount's statistics served over HTTP for a Prometheus server to scrape,
//! by `hyper` (HTTP/1.1) on one thread of the daemon. `GET /metrics` answers the same text as
//! `loosefs stats --format prometheus` (text format 0.0.4), or OpenMetrics 1.0 when the
//! request's `Accept` header names `application/openmetrics-text` (what Prometheus asks for
//! first); any other path answers 404, any other method 405. Each answer is a fresh report.
//!
//! A stuck or hostile client cannot hurt the mount: a request's head is read into at most
//! [`MAX_HEAD`] bytes and [`MAX_HEADERS`] headers (more answers 431), within
//! [`Limits::head_timeout`]; a connection lives at most [`Limits::connection_timeout`]; at
//! most [`MAX_CONNECTIONS`] are open at once (others are closed as they arrive). All of it runs
//! on one thread, whatever the number of clients.

use crate::fs::Fs;
use anyhow::{Context, Result, anyhow};
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Prometheus text format 0.0.4's content type.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics 1.0's content type.
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bytes a request's head (request line and headers) may take: a scrape's is a few hundred
/// (hyper's smallest buffer is 8 KiB).
pub const MAX_HEAD: usize = 16 << 10;
/// Headers a request may carry.
pub const MAX_HEADERS: usize = 64;
/// Connections open at once; one more is closed at once.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a client may take.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// To send a request's head, from the connection or the previous answer.
    pub head_timeout: Duration,
    /// For the whole connection (keep-alive scrapes reconnect after it).
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(300),
        }
    }
}

/// A bound metrics endpoint, not yet answering: binding comes before the mount, so that an
/// address in use fails the mount command instead of a daemon that already serves files.
pub(crate) struct Endpoint {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    limits: Limits,
    /// Whether OpenMetrics is answered to a client that asks for it (else Prometheus text).
    openmetrics: bool,
}

impl Endpoint {
    /// Binds `addr` (port 0 takes a free port; [`Endpoint::addr`] tells which). Errors name
    /// the flag and the address (in use, not this machine's, no permission).
    pub(crate) fn bind(addr: SocketAddr) -> Result<Endpoint> {
        let listener =
            std::net::TcpListener::bind(addr).map_err(|e| anyhow!("--metrics-addr {addr}: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| anyhow!("--metrics-addr {addr}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| anyhow!("--metrics-addr {addr}: {e}"))?;
        Ok(Endpoint {
            listener,
            addr,
            limits: Limits::default(),
            openmetrics: true,
        })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers requests on a thread of its own until the process ends, each with a report of
    /// `fs` labelled with `mountpoint`. Errors: the thread or its runtime cannot start.
    pub(super) fn serve(self, fs: Arc<Fs>, mountpoint: String) -> Result<()> {
        let render = move |om: bool| {
            let r = fs.report();
            match om {
                true => crate::metrics::openmetrics(&r, &mountpoint),
                false => crate::metrics::prometheus(&r, &mountpoint),
            }
        };
        self.serve_with(Arc::new(render))
    }

    /// Answers requests on a thread of its own until the process ends, each with the
    /// Prometheus text `render()` makes (never OpenMetrics, whatever the client asks).
    /// Errors: the thread or its runtime cannot start.
    pub(crate) fn serve_prometheus(
        mut self,
        render: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> Result<()> {
        self.openmetrics = false;
        self.serve_with(Arc::new(move |_| render()))
    }

    /// [`Endpoint::serve`] with `render(openmetrics)` making the text.
    fn serve_with(self, render: Arc<dyn Fn(bool) -> String + Send + Sync>) -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the metrics endpoint's runtime")?;
        let Endpoint {
            listener,
            limits,
            openmetrics,
            ..
        } = self;
        std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || rt.block_on(accept_loop(listener, limits, openmetrics, render)))?;
        Ok(())
    }
}

/// Accepts connections for ever, each served on the runtime as a task of its own (at most
/// [`MAX_CONNECTIONS`] at once).
async fn accept_loop(
    listener: std::net::TcpListener,
    limits: Limits,
    offers_openmetrics: bool,
    render: Arc<dyn Fn(bool) -> String + Send + Sync>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            log::error!("metrics endpoint: cannot listen: {e}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused_logged = false;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait a little rather than spin.
                log::debug!("metrics endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !std::mem::replace(&mut refused_logged, true) {
                log::warn!(
                    "metrics endpoint: {MAX_CONNECTIONS} connections open; more are closed as they arrive"
                );
            }
            drop(stream);
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let om = offers_openmetrics
                        && (req.headers().get_all(http::header::ACCEPT).iter()).any(|v| {
                            v.to_str()
                                .is_ok_and(|v| v.contains("application/openmetrics-text"))
                        });
                    let (status, kind, body) =
                        answer(req.method(), req.uri().path(), om, |om| render(om));
                    let mut resp = Response::new(Full::new(bytes::Bytes::from(body)));
                    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(kind),
                    );
                    std::future::ready(Ok::<_, std::convert::Infallible>(resp))
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .max_buf_size(MAX_HEAD)
                .max_headers(MAX_HEADERS)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(limits.connection_timeout, conn).await {
                log::debug!("metrics endpoint: a connection: {e}");
            }
            drop(slot);
        });
    }
}

/// The status, content type and body answering `method` on `path`; `render(openmetrics)`
/// makes the metrics' text.
fn answer(
    method: &Method,
    path: &str,
    openmetrics: bool,
    render: impl FnOnce(bool) -> String,
) -> (u16, &'static str, String) {
    if path != "/metrics" {
        return (404, "text/plain", "not found: GET /metrics\n".into());
    }
    if *method != Method::GET && *method != Method::HEAD {
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
    use std::io::{Read, Write};

    fn render(om: bool) -> String {
        format!("openmetrics={om}")
    }

    #[test]
    fn metrics_answers_prometheus_text_or_openmetrics_as_asked() {
        let got = answer(&Method::GET, "/metrics", false, render);
        assert_eq!(got, (200, PROMETHEUS_TEXT, "openmetrics=false".into()));
        let got = answer(&Method::GET, "/metrics", true, render);
        assert_eq!(got, (200, OPENMETRICS_TEXT, "openmetrics=true".into()));
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        assert_eq!(answer(&Method::GET, "/", false, render).0, 404);
        assert_eq!(answer(&Method::POST, "/metrics", false, render).0, 405);
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

    /// An endpoint answering with [`render`], with `limits`.
    fn serving(limits: Limits) -> SocketAddr {
        let mut e = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        e.limits = limits;
        let addr = e.addr();
        e.serve_with(Arc::new(render)).unwrap();
        addr
    }

    /// One request on a new connection; the whole answer (the server closes after it).
    fn get(addr: SocketAddr, head: &str) -> std::io::Result<String> {
        let mut c = std::net::TcpStream::connect(addr)?;
        c.set_read_timeout(Some(Duration::from_secs(30)))?;
        c.write_all(head.as_bytes())?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_scrape_gets_the_text_it_asks_for() {
        let addr = serving(Limits::default());
        let r = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(
            r.contains(PROMETHEUS_TEXT) && r.ends_with("openmetrics=false"),
            "{r}"
        );
        let r = get(
            addr,
            "GET /metrics?x=1 HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,*/*;q=0.1\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        assert!(r.ends_with("openmetrics=true"), "{r}");
    }

    #[test]
    fn an_endless_header_line_is_cut_off_at_the_head_limit() {
        let addr = serving(Limits::default());
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nX-Endless: ")
            .unwrap();
        // Sent until the server stops reading: it gives up after MAX_HEAD bytes, however many
        // more the client has.
        let chunk = vec![b'a'; 4096];
        let mut sent = 0usize;
        while sent < 64 << 20 {
            match c.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
            if sent > 4 * MAX_HEAD {
                break;
            }
        }
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out:?}");
    }

    #[test]
    fn idle_connections_are_capped_and_timed_out_and_scrapes_then_answered() {
        let addr = serving(Limits {
            head_timeout: Duration::from_millis(300),
            connection_timeout: Duration::from_secs(5),
        });
        // Many idle connections: the cap closes those past it; none holds a thread.
        let idle: Vec<_> = (0..200)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
        assert!(threads < 100, "{threads} threads");
        // The idle ones time out; a scrape is then answered (retried until then).
        let t0 = std::time::Instant::now();
        loop {
            match get(addr, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n") {
                Ok(r) if r.starts_with("HTTP/1.1 200") => break,
                _ if t0.elapsed() < Duration::from_secs(60) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                other => panic!("no answer after the idle connections: {other:?}"),
            }
        }
        drop(idle);
    }
}
