//! Directory listings an HTTP(S) server offers: `https://host/train/` answered with nginx's
//! `autoindex_format json` listing (<https://nginx.org/en/docs/http/ngx_http_autoindex_module.html>):
//! a JSON array of `{"name", "type": "file"|"directory", "mtime": RFC 1123 date, "size":
//! bytes}`, one level per request. Object stores' own listings (S3's `ListObjectsV2`) go
//! through `object_store`; its HTTP store lists only by WebDAV `PROPFIND`, which static file
//! servers do not answer, and cannot ask for a path ending in `/`, hence this small reader.
//!
//! Such a listing gives no ETag: an object listed here is pinned to its size and
//! `Last-Modified` ([`Pin::modified`]), which every GET then checks.

use super::source::{Level, Listed, Pin};
use anyhow::{Context, Result, anyhow, bail};
use object_store::client::{HttpClient, HttpRequestBody};
use std::time::Duration;

/// How a directory URL is listed: the client (the store's own TLS roots, timeouts) and its
/// retries of a failed request.
#[derive(Debug, Clone)]
pub struct DirLister {
    /// The HTTP client.
    pub client: HttpClient,
    /// Retries of a request that failed on the network or with a 5xx.
    pub retries: usize,
    /// Give up retrying after this long.
    pub retry_timeout: Duration,
}

/// One entry of an nginx JSON listing.
#[derive(serde::Deserialize)]
struct AutoindexEntry {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    mtime: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

/// What to do where a directory has no listing loosefs reads.
pub const NO_LISTING: &str = "serve the directory with a listing (nginx: `autoindex on; autoindex_format json;`), or publish a shared listing beside it (`loosefs index URL --out FILE` on a copy that lists, uploaded as URL.loosefs-index)";

/// `date` (RFC 1123, `Wed, 25 Nov 2026 10:00:00 GMT`, as nginx writes it) as seconds since
/// the Unix epoch. Errors: another form.
fn seconds(date: &str) -> Result<i64> {
    chrono::DateTime::parse_from_rfc2822(date)
        .map(|d| d.timestamp())
        .map_err(|e| anyhow!("bad date {date:?}: {e}"))
}

/// The level `body` (an nginx JSON listing of `url`, served as `content_type`) describes.
///
/// Errors: not JSON (an HTML listing, say: the message says which listing to turn on), a file
/// without a size or a date, an entry of another type.
pub fn parse(url: &str, content_type: &str, body: &[u8]) -> Result<Level> {
    let start = body.iter().find(|b| !b.is_ascii_whitespace());
    if !content_type.contains("json") && start != Some(&b'[') {
        bail!(
            "{url}: the server answers with {}, not a listing loosefs reads: {NO_LISTING}",
            match content_type {
                "" => "no content type",
                t => t,
            }
        );
    }
    let entries: Vec<AutoindexEntry> = serde_json::from_slice(body)
        .with_context(|| format!("{url}: not an nginx JSON directory listing"))?;
    let mut level = Level::default();
    for e in entries {
        match e.kind.as_str() {
            // `.` and `..` (which a URL join drops: the directory itself, listed forever), an
            // empty name or one holding `/` name no subdirectory.
            "directory" if matches!(e.name.as_str(), "" | "." | "..") || e.name.contains('/') => {
                log::warn!(
                    "{url}: the listed directory {:?} left out: not a name",
                    e.name
                )
            }
            "directory" => level.dirs.push(e.name),
            "file" => {
                let (Some(size), Some(mtime)) = (e.size, e.mtime) else {
                    bail!("{url}: the listing gives {:?} no size or date", e.name);
                };
                let modified = seconds(&mtime).with_context(|| format!("{url}: {:?}", e.name))?;
                level.objects.push(Listed {
                    key: e.name,
                    pin: Some(Pin {
                        size,
                        etag: String::new(),
                        version: None,
                        modified: Some(modified),
                    }),
                    modified,
                });
            }
            // Symbolic links to nothing, sockets: nothing to serve.
            other => log::info!("{url}: {:?} left out (a listed {other})", e.name),
        }
    }
    level.objects.sort_by(|a, b| a.key.cmp(&b.key));
    level.dirs.sort();
    Ok(level)
}

/// `dir` (a URL ending in `/`) with `name` appended as one path segment (percent-encoded),
/// and a `/` when `as_dir`. Errors: `dir` is no URL.
pub fn join(dir: &str, name: &str, as_dir: bool) -> Result<String> {
    let mut u = url::Url::parse(dir).with_context(|| format!("{dir}: bad URL"))?;
    {
        let mut s = u
            .path_segments_mut()
            .map_err(|_| anyhow!("{dir}: a URL without a path"))?;
        s.pop_if_empty().push(name);
        if as_dir {
            s.push("");
        }
    }
    Ok(u.into())
}

/// Levels of directories [`DirLister::below`] lists below a URL (ImageNet's tree has 2).
pub const MAX_DEPTH: usize = 64;

/// Directories [`DirLister::below`] lists below a URL at most: one GET each.
pub const MAX_DIRS: usize = 100_000;

impl DirLister {
    /// One level of the directory at `url` (ending in `/`): one GET, retried on the network
    /// or a 5xx. Errors: 404 or 403 (no such directory, or no listing there), a body that is
    /// no listing ([`parse`]), the network after the retries.
    pub async fn level(&self, url: &str) -> Result<Level> {
        let mut tries = 0;
        let started = std::time::Instant::now();
        loop {
            let req = http::Request::get(url)
                .body(HttpRequestBody::empty())
                .with_context(|| format!("{url}: bad URL"))?;
            let transient = match self.client.execute(req).await {
                Ok(r) if r.status().is_success() => {
                    let kind = (r.headers().get(http::header::CONTENT_TYPE))
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    match r.into_body().bytes().await {
                        Ok(body) => return parse(url, &kind, &body),
                        Err(e) => e.to_string(),
                    }
                }
                Ok(r) if r.status().is_server_error() => r.status().to_string(),
                Ok(r) => bail!(
                    "{url}: the server answers {} to a GET of the directory: {NO_LISTING}",
                    r.status()
                ),
                Err(e) if super::fail_fast::is_permanent(&e) => {
                    bail!(
                        "{url}: cannot list the directory: {} ({})",
                        super::fail_fast::with_causes(&e),
                        super::fail_fast::CERTIFICATE_FIX
                    )
                }
                Err(e) => super::fail_fast::with_causes(&e),
            };
            tries += 1;
            if tries > self.retries || started.elapsed() > self.retry_timeout {
                bail!("{url}: cannot list the directory: {transient}");
            }
            let wait = Duration::from_millis(100 << tries.min(7)).min(Duration::from_secs(15));
            tokio::time::sleep(wait).await;
        }
    }

    /// Every file below the directory `url` (ending in `/`) whose first level is `level`,
    /// keys relative to it, sorted: the directories listed breadth first, `at_once` at a
    /// time, at most [`MAX_DEPTH`] levels deep (deeper ones are left out and logged: a link
    /// loop on the server, `a -> .`, lists ever deeper) and [`MAX_DIRS`] directories in all.
    ///
    /// Errors: as [`Self::level`], naming the directory that failed; more than
    /// [`MAX_DIRS`] directories.
    pub async fn below(&self, url: &str, level: Level, at_once: usize) -> Result<Vec<Listed>> {
        use futures::{StreamExt, TryStreamExt};
        let mut out = level.objects;
        let mut todo: Vec<String> = level.dirs;
        let mut listed = 0usize;
        let mut depth = 1;
        while !todo.is_empty() {
            depth += 1;
            if depth > MAX_DEPTH {
                log::warn!(
                    "{url}: {} directories deeper than {MAX_DEPTH} levels left out (a link \
                     loop on the server?), {:?} among them",
                    todo.len(),
                    todo[0]
                );
                break;
            }
            listed += todo.len();
            if listed > MAX_DIRS {
                bail!(
                    "{url}: more than {MAX_DIRS} directories below it (a link loop on the \
                     server?): mount a directory further down, or publish a shared listing \
                     ({NO_LISTING})"
                );
            }
            let found: Vec<(String, Level)> = futures::stream::iter(todo.drain(..))
                .map(|rel| async move {
                    let at =
                        (rel.split('/')).try_fold(url.to_string(), |u, seg| join(&u, seg, true))?;
                    Ok::<_, anyhow::Error>((rel, self.level(&at).await?))
                })
                .buffer_unordered(at_once.max(1))
                .try_collect()
                .await?;
            for (rel, l) in found {
                out.extend(l.objects.into_iter().map(|mut o| {
                    o.key = format!("{rel}/{}", o.key);
                    o
                }));
                todo.extend(l.dirs.into_iter().map(|d| format!("{rel}/{d}")));
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nginx_json_listing_gives_files_pinned_to_size_and_date_and_directories() {
        let body = br#"[
{ "name":"n01440764", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" },
{ "name":"b c.JPEG", "type":"file", "mtime":"Wed, 25 Nov 2026 10:00:01 GMT", "size":1234 },
{ "name":"a.txt", "type":"file", "mtime":"Thu, 01 Jan 1970 00:00:10 GMT", "size":0 },
{ "name":"dangling", "type":"other", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" }
]"#;
        let l = parse("https://h/d/", "application/json", body).unwrap();
        assert_eq!(l.dirs, vec!["n01440764".to_string()]);
        let keys: Vec<&str> = l.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a.txt", "b c.JPEG"]);
        let p = l.objects[1].pin.clone().unwrap();
        assert_eq!(
            (p.size, p.etag.as_str(), p.modified),
            (1234, "", Some(1795600801))
        );
        assert_eq!(l.objects[0].modified, 10);
        assert!(l.more.is_none());
    }

    #[test]
    fn dot_dot_dot_and_slashed_directory_names_are_left_out() {
        let body = br#"[
{ "name":".", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" },
{ "name":"..", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" },
{ "name":"", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" },
{ "name":"a/..", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" },
{ "name":"ok", "type":"directory", "mtime":"Wed, 25 Nov 2026 10:00:00 GMT" }
]"#;
        let l = parse("https://h/d/", "application/json", body).unwrap();
        assert_eq!(l.dirs, vec!["ok".to_string()]);
    }

    #[test]
    fn an_html_listing_or_a_broken_one_is_refused_saying_what_to_turn_on() {
        let e = parse("https://h/d/", "text/html", b"<html>Index of /d/</html>").unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("text/html") && e.contains("autoindex_format json"),
            "{e}"
        );
        assert!(e.contains("loosefs index"), "{e}");
        let e = parse(
            "https://h/d/",
            "application/json",
            br#"[{"name":"x","type":"file"}]"#,
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("no size or date"));
        let e = parse("https://h/d/", "application/json", b"{not json");
        assert!(format!("{:#}", e.unwrap_err()).contains("not an nginx JSON"));
    }

    #[test]
    fn names_are_joined_as_one_encoded_segment() {
        assert_eq!(
            join("https://h:1/d/", "a b#?.jpg", false).unwrap(),
            "https://h:1/d/a%20b%23%3F.jpg"
        );
        assert_eq!(
            join("https://h/d/", "n01", true).unwrap(),
            "https://h/d/n01/"
        );
        assert_eq!(join("https://h/", "x:y", true).unwrap(), "https://h/x:y/");
    }
}
