//! A GCS emulator reached as Google's client libraries reach one: through the JSON API.
//! `object_store`'s GCS client speaks the XML API (`GET /BUCKET/KEY`, `GET /BUCKET?list-type=2`),
//! which fake-gcs-server answers only on the host it was started with as `-public-host`
//! (default `storage.googleapis.com`): a default-started emulator at `$STORAGE_EMULATOR_HOST`
//! answered every read 404. Its JSON API answers on any host, so requests to an emulator are
//! rewritten here on their way out ([`to_json_api`]):
//!
//! - an object's `GET`/`HEAD /BUCKET/KEY` → the media download `/download/storage/v1/b/BUCKET/o/KEY`
//!   (the same headers: `Content-Length`, `ETag`, `X-Goog-Generation`, ranges);
//! - a listing page `GET /BUCKET?list-type=2&prefix=…&delimiter=…&continuation-token=…` →
//!   `GET /storage/v1/b/BUCKET/o?prefix=…&delimiter=…&pageToken=…`, whose JSON answer
//!   ([`listing_to_xml`]) is given back as the `ListObjectsV2` page `object_store` parses.
//!
//! Formats: Cloud Storage JSON API, "Objects: list" and "Objects: get" (`alt=media`);
//! <https://cloud.google.com/storage/docs/json_api/v1/objects/list>. Real GCS is never
//! rewritten (only the endpoint `$STORAGE_EMULATOR_HOST` names).

use object_store::client::HttpRequest;
use quick_xml::escape::escape;
use serde::Deserialize;

/// Rewrites `req` (an XML API request of `object_store`'s GCS client) into the JSON API's.
/// Returns whether it is now a listing page, whose JSON answer [`listing_to_xml`] turns back.
/// A request of any other shape (an upload) is left as it is.
pub(crate) fn to_json_api(req: &mut HttpRequest) -> bool {
    let uri = req.uri();
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return false;
    };
    let path = uri.path().trim_start_matches('/');
    let query = uri.query().unwrap_or("");
    let listing = super::list_pages::list_request(uri).is_some();
    let new = match path.split_once('/') {
        None if listing && !path.is_empty() => {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
                match &*k {
                    "prefix" => q.append_pair("prefix", &v),
                    "delimiter" => q.append_pair("delimiter", &v),
                    "continuation-token" => q.append_pair("pageToken", &v),
                    "max-keys" => q.append_pair("maxResults", &v),
                    _ => &mut q,
                };
            }
            format!(
                "{scheme}://{authority}/storage/v1/b/{path}/o?{}",
                q.finish()
            )
        }
        Some((bucket, key))
            if !key.is_empty()
                && (req.method() == http::Method::GET || req.method() == http::Method::HEAD) =>
        {
            let q = match query.is_empty() {
                true => String::new(),
                false => format!("?{query}"),
            };
            format!("{scheme}://{authority}/download/storage/v1/b/{bucket}/o/{key}{q}")
        }
        _ => return false,
    };
    match new.parse() {
        Ok(u) => {
            *req.uri_mut() = u;
            listing
        }
        Err(_) => false,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Objects {
    #[serde(default)]
    items: Vec<Object>,
    #[serde(default)]
    prefixes: Vec<String>,
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct Object {
    name: String,
    /// A decimal string (the JSON API's `uint64` form).
    size: String,
    updated: String,
    etag: Option<String>,
}

/// The JSON API's "Objects: list" answer `json` as the `ListObjectsV2` page (`Contents`,
/// `CommonPrefixes`, `NextContinuationToken`) `object_store`'s parser takes. Errors: not that
/// JSON, said in words.
pub(crate) fn listing_to_xml(json: &[u8]) -> Result<Vec<u8>, String> {
    let page: Objects = serde_json::from_slice(json)
        .map_err(|e| format!("the emulator's JSON listing page: {e}"))?;
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult>");
    for o in &page.items {
        x += &format!(
            "<Contents><Key>{}</Key><Size>{}</Size><LastModified>{}</LastModified>",
            escape(o.name.as_str()),
            escape(o.size.as_str()),
            escape(o.updated.as_str())
        );
        if let Some(e) = &o.etag {
            x += &format!("<ETag>{}</ETag>", escape(e.as_str()));
        }
        x += "</Contents>";
    }
    for p in &page.prefixes {
        x += &format!(
            "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
            escape(p.as_str())
        );
    }
    if let Some(t) = &page.next_page_token {
        x += &format!(
            "<NextContinuationToken>{}</NextContinuationToken>",
            escape(t.as_str())
        );
    }
    x += "</ListBucketResult>";
    Ok(x.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(method: http::Method, uri: &str) -> (String, bool) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(object_store::client::HttpRequestBody::from(Vec::<u8>::new()))
            .unwrap();
        let listing = to_json_api(&mut req);
        (req.uri().to_string(), listing)
    }

    #[test]
    fn reads_and_listings_take_the_json_api() {
        assert_eq!(
            rewritten(http::Method::GET, "http://h:1/bkt/d/a%20b.txt"),
            (
                "http://h:1/download/storage/v1/b/bkt/o/d/a%20b.txt".into(),
                false
            )
        );
        assert_eq!(
            rewritten(http::Method::HEAD, "http://h:1/bkt/x?generation=7").0,
            "http://h:1/download/storage/v1/b/bkt/o/x?generation=7"
        );
        assert_eq!(
            rewritten(
                http::Method::GET,
                "http://h:1/bkt?list-type=2&prefix=d%2F&delimiter=%2F&continuation-token=t1"
            ),
            (
                "http://h:1/storage/v1/b/bkt/o?prefix=d%2F&delimiter=%2F&pageToken=t1".into(),
                true
            )
        );
        // An upload is left alone.
        assert_eq!(
            rewritten(http::Method::PUT, "http://h:1/bkt/k").0,
            "http://h:1/bkt/k"
        );
    }

    #[test]
    fn a_json_page_becomes_a_list_objects_v2_page() {
        let json = br#"{"kind":"storage#objects","items":[{"name":"d/a&b.txt","size":"11",
            "updated":"2026-12-03T00:51:43.782833Z","etag":"XrY="}],"prefixes":["d/e/"],
            "nextPageToken":"n2"}"#;
        let x = String::from_utf8(listing_to_xml(json).unwrap()).unwrap();
        assert!(x.contains("<Key>d/a&amp;b.txt</Key><Size>11</Size>"), "{x}");
        assert!(x.contains("<CommonPrefixes><Prefix>d/e/</Prefix></CommonPrefixes>"));
        assert!(x.contains("<NextContinuationToken>n2</NextContinuationToken>"));
        assert!(listing_to_xml(b"{}").is_ok());
        assert!(
            listing_to_xml(b"<x/>")
                .unwrap_err()
                .contains("JSON listing")
        );
    }
}
