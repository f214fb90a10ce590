//! How a URL becomes a configured `object_store` client: the store that claims it
//! ([`super::stores`]) builds the client, with the timeouts, retries and CA bundle of
//! [`RemoteConfig`] set here for all; where its key begins and how keys and URLs map to each
//! other; the preflight that fails fast on an endpoint nothing listens at.

use super::remote_config::RemoteConfig;
use super::store::{Lister, Setup, Store, env};
use super::stores::{all_forms, store_of};
use anyhow::{Context, Result, anyhow, bail};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Whether `src` names a remote object: a URL one of the stores claims
/// ([`super::stores::STORES`]).
pub fn is_url(src: &str) -> bool {
    store_of(src).is_some()
}

/// Whether `url` names an object of a bucket store (S3, GCS, Azure): its prefixes are listed
/// page by page, and indexes and packs are uploaded to it (an HTTP(S) server is read only).
pub fn is_bucket_url(url: &str) -> bool {
    store_of(url).is_some_and(|s| s.is_bucket())
}

/// The URL forms indexes and packs can be written to, for messages ("s3://BUCKET/KEY, …").
pub fn bucket_forms() -> String {
    super::stores::bucket_forms()
}

/// The store of `url`. Errors: no store claims it, naming the forms loosefs reads.
fn store(url: &str) -> Result<&'static dyn Store> {
    store_of(url).ok_or_else(|| anyhow!("{url}: not a URL loosefs reads (give {})", all_forms()))
}

/// The store and object path of `url` (any form of [`super::stores::STORES`]), and the
/// same store's way of listing prefixes. Nothing is requested yet.
///
/// Errors: a malformed URL, plain http without `--allow-http`, an unreadable CA bundle, a
/// store's configuration it cannot use. (No credentials fails the first request,
/// [`super::credentials`].)
pub(super) fn store_for(
    url: &str,
    args: &RemoteConfig,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath, Lister)> {
    let kind = store(url)?;
    let (at, key) = kind.split(url)?;
    let path = key_path(url, key)?;
    let mut client = ClientOptions::new()
        .with_timeout(Duration::from_secs(args.request_timeout.max(1)))
        .with_connect_timeout(Duration::from_secs(10))
        .with_allow_http(args.allow_http);
    let ca = args
        .ca_bundle
        .clone()
        .or_else(|| env("AWS_CA_BUNDLE").map(PathBuf::from));
    if let Some(ca) = ca {
        let pem = std::fs::read(&ca)
            .with_context(|| format!("cannot read the CA bundle {}", ca.display()))?;
        for c in object_store::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{}: not a PEM certificate bundle", ca.display()))?
        {
            client = client.with_root_certificate(c);
        }
    }
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: args.retries,
        retry_timeout: Duration::from_secs(args.retry_timeout.max(1)),
    };
    let (store, lister) = kind
        .build(
            url,
            at,
            Setup {
                args,
                client,
                retry,
            },
        )
        .with_context(|| format!("{url}: cannot set up the {} client", kind.name()))?;
    Ok((store, path, lister))
}

/// How long [`preflight`] waits for a TCP connection before leaving the verdict to the
/// requests and their retries.
const PREFLIGHT_CONNECT: Duration = Duration::from_secs(5);

/// Fails fast where no retry can help: the host of `url` (or of its S3 endpoint, when one is
/// given: AWS's own endpoints are not probed) does not resolve, or nothing listens at its
/// address and port (every address refuses the connection). One TCP connection, opened and
/// closed, no request sent; a timeout or any other outcome passes (the requests' retries
/// judge a slow network).
///
/// Errors: those two, naming the host, the port and the option that sets them.
pub(super) fn preflight(url: &str, args: &RemoteConfig) -> Result<()> {
    use std::net::ToSocketAddrs;
    let Some((target, option)) = store(url)?.endpoint(url, args) else {
        return Ok(());
    };
    let Ok(u) = url::Url::parse(&target) else {
        return Ok(());
    };
    let (Some(host), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
        return Ok(());
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<std::net::SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        // Typed (`io::ErrorKind`), so a command's exit code says the server is out of reach.
        Err(e) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::HostUnreachable,
                format!("{url}: cannot resolve {host}: {e} (check {option})"),
            )
            .into());
        }
    };
    let mut refused = 0;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, PREFLIGHT_CONNECT) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused += 1,
            Err(_) => {}
        }
    }
    if refused > 0 && refused == addrs.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!(
                "{url}: nothing listens at {host}:{port} (connection refused; check {option}, \
                 its port, and that the server is running)"
            ),
        )
        .into());
    }
    Ok(())
}

/// Where the store of a URL ends and the object's key begins ([`Store::split`]): (`s3://bucket`
/// or `https://host:port`, key). Errors: not a URL of a store, or no key.
fn split_url(url: &str) -> Result<(&str, &str)> {
    store(url)?.split(url)
}

/// The key of `url` in the store of `base` (another object's URL), for a client sharing that
/// store. Errors: `url` is malformed, or names another scheme, bucket or host than `base`.
pub(super) fn sibling_path(base: &str, url: &str) -> Result<ObjectPath> {
    let (store, _) = split_url(base)?;
    let (other, key) = split_url(url)?;
    if !store.eq_ignore_ascii_case(other) {
        bail!("{url}: not on the same bucket or host as {base}");
    }
    key_path(url, key)
}

/// The store path of `key` (the part of `url` after its bucket or host). An `s3://` or `gs://`
/// URL holds
/// the key as it is (`s3://b/données/50%off.txt` is the key `données/50%off.txt`; the S3
/// client percent-encodes it once in the request), an HTTP(S) URL its path percent-encoded
/// (it is decoded here and encoded again per segment in the request) — [`url_below`] makes
/// either from a listed name. Errors: a key `object_store` cannot hold (an empty, `.` or `..`
/// segment, a control character), or an HTTP path that is not UTF-8 once decoded.
fn key_path(url: &str, key: &str) -> Result<ObjectPath> {
    if store_of(url).is_some_and(|s| !s.encoded_keys(url)) {
        ObjectPath::parse(key).with_context(|| format!("{url}: bad object key"))
    } else {
        ObjectPath::from_url_path(key).with_context(|| format!("{url}: bad object path"))
    }
}

/// Bytes percent-encoded in one segment of an HTTP(S) URL's path: those the URL standard's
/// path-segment set encodes, plus `%` (a name holding `%20` is not a name holding a space)
/// and `/` (source: the WHATWG URL standard, "path percent-encode set").
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'%')
    .add(b'/')
    .add(b'\\')
    .add(b'[')
    .add(b']')
    .add(b'^')
    .add(b'|');

/// The URL of the object named `key` (as its listing gave it, segments joined by `/`, not
/// encoded) below the prefix URL `prefix` (ending in `/`): for `s3://` the key appended as
/// it is, for HTTP(S) each segment percent-encoded (a file listed as `a%20b.txt` is
/// `…/a%2520b.txt`, never `a b.txt`), as [`key_path`] reads them back.
pub fn url_below(prefix: &str, key: &str) -> String {
    if store_of(prefix).is_some_and(|s| !s.encoded_keys(prefix)) {
        return format!("{prefix}{key}");
    }
    let mut out = prefix.to_string();
    for (i, seg) in key.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.extend(percent_encoding::utf8_percent_encode(seg, SEGMENT));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str, args: &RemoteConfig) -> String {
        match store_for(url, args) {
            Ok(_) => panic!("{url}: accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_listed_name_becomes_a_url_whose_key_is_that_name() {
        // S3 URLs hold keys as they are: the request encodes them once.
        for name in ["café.txt", "50%off.txt", "a*b\\c#d.txt", "数据/x y.txt"] {
            let url = url_below("s3://b/p/", name);
            assert_eq!(url, format!("s3://b/p/{name}"));
            let key = key_path(&url, &url[5 + 2..]).unwrap();
            assert_eq!(key.as_ref(), format!("p/{name}"), "{name}");
        }
        // HTTP URLs hold paths percent-encoded: a name holding `%20` is not one holding a space.
        for (name, enc) in [
            ("a%20b.txt", "a%2520b.txt"),
            ("a b.txt", "a%20b.txt"),
            ("x%ff.txt", "x%25ff.txt"),
            ("café/#?.txt", "caf%C3%A9/%23%3F.txt"),
        ] {
            let url = url_below("https://h:1/d/", name);
            assert_eq!(url, format!("https://h:1/d/{enc}"));
            let (_, key) = split_url(&url).unwrap();
            assert_eq!(key_path(&url, key).unwrap().as_ref(), format!("d/{name}"));
        }
        assert!(key_path("s3://b/a//b", "a//b").is_err());
    }

    #[test]
    fn a_refused_port_fails_at_once_naming_it_and_the_option() {
        let a = RemoteConfig {
            allow_http: true,
            ..RemoteConfig::default()
        };
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = preflight(&format!("http://127.0.0.1:{port}/x.pack"), &a).unwrap_err();
        assert!(
            e.to_string().contains("nothing listens at 127.0.0.1"),
            "{e}"
        );
        let s3 = RemoteConfig {
            endpoint_url: Some(format!("http://127.0.0.1:{port}")),
            ..a.clone()
        };
        let e = preflight("s3://b/x.pack", &s3).unwrap_err().to_string();
        assert!(e.contains("--endpoint-url"), "{e}");
        // A listening port passes (no request is sent).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ok = format!("http://{}/x.pack", l.local_addr().unwrap());
        preflight(&ok, &a).unwrap();
    }

    #[test]
    fn siblings_share_the_bucket_or_host_only() {
        let p = sibling_path("s3://b/ds/index.json", "s3://b/ds/shard.00000.mds").unwrap();
        assert_eq!(p.as_ref(), "ds/shard.00000.mds");
        let p = sibling_path("https://h:8443/d/a.tar", "https://h:8443/d/b%20c.tar").unwrap();
        assert_eq!(p.as_ref(), "d/b c.tar");
        for (base, url) in [
            ("s3://b/ds/x", "s3://other/ds/y"),
            ("s3://b/ds/x", "https://b/ds/y"),
            ("https://h/d/x", "https://g/d/y"),
            ("s3://b/ds/x", "s3://b/"),
            ("s3://b/ds/x", "nonsense"),
        ] {
            assert!(sibling_path(base, url).is_err(), "{url}");
        }
    }

    #[test]
    fn malformed_urls_are_refused_with_what_to_give() {
        let a = RemoteConfig::default();
        for (url, want) in [
            ("s3://bucket", "give s3://BUCKET/KEY"),
            ("s3:///key", "give s3://BUCKET/KEY"),
            ("s3://bucket/", "give s3://BUCKET/KEY"),
            ("https://host", "no object path"),
            ("https://host/", "no object path"),
            ("gs://bucket", "give gs://BUCKET/KEY"),
            ("gs://bucket/", "give gs://BUCKET/KEY"),
            (
                "ftp://host/x.pack",
                "not a URL loosefs reads (give s3://BUCKET/KEY, gs://BUCKET/KEY",
            ),
        ] {
            let e = err(url, &a);
            assert!(e.contains(url) && e.contains(want), "{url}: {e}");
        }
    }

    #[test]
    fn plain_http_needs_allow_http_for_urls_and_endpoints() {
        let mut a = RemoteConfig::default();
        let e = err("http://127.0.0.1:9/x.pack", &a);
        assert!(e.contains("--allow-http"), "{e}");
        a.endpoint_url = Some("http://127.0.0.1:9".into());
        a.no_sign_request = true;
        let e = err("s3://b/k.pack", &a);
        assert!(e.contains("--allow-http"), "{e}");
        a.allow_http = true;
        let (_, path, _) = store_for("s3://b/dir/k.pack", &a).unwrap();
        assert_eq!(path.as_ref(), "dir/k.pack");
        let (_, path, _) = store_for("http://127.0.0.1:9/a/b%20c.pack", &a).unwrap();
        assert_eq!(path.as_ref(), "a/b c.pack");
    }

    #[test]
    fn a_ca_bundle_must_be_readable_pem() {
        let d = tempfile::tempdir().unwrap();
        let mut a = RemoteConfig {
            ca_bundle: Some(d.path().join("missing.pem")),
            ..RemoteConfig::default()
        };
        let e = err("https://host/x.pack", &a);
        assert!(
            e.contains("cannot read the CA bundle") && e.contains("missing.pem"),
            "{e}"
        );
        let bad = d.path().join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        a.ca_bundle = Some(bad);
        let e = err("https://host/x.pack", &a);
        assert!(e.contains("bad.pem") && e.contains("not a PEM"), "{e}");
    }
}
