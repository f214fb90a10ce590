//! Listing pages of bucket stores made safe to hand to `object_store`: S3's and GCS's
//! `ListObjectsV2` pages and Azure's `List Blobs` pages ([`Dialect`]). Its parsers refuse a
//! whole page for one key its paths cannot hold (an empty segment as in `a//b`, a `.` or `..`
//! segment, a control character: "Encountered object with invalid path"), so one odd key
//! among a million failed the mount of the whole prefix. Each page's XML body is read here
//! before `object_store` parses it: such keys (and common prefixes) are cut out of it and
//! logged, once per key, as the docs promise; everything else is passed on byte for byte.
//! A page whose next token (`NextContinuationToken`, Azure's `NextMarker`) is the very token it
//! was asked with is refused: a server answering so would be listed forever (boto3's paginator
//! stops the same way, "same next token received twice").
//!
//! Own code over a crate: `object_store` has no hook for a tolerant parser, and signing and
//! sending the requests ourselves would copy what it does well. The page format is AWS's
//! `ListObjectsV2` response (<https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html>)
//! and Azure's `List Blobs` response (<https://learn.microsoft.com/rest/api/storageservices/list-blobs>).

use object_store::path::Path as ObjectPath;
use quick_xml::events::Event;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::Mutex;

/// How one store's listing page is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dialect {
    /// How deep entries sit (1: children of the root element).
    depth: usize,
    /// The entry elements (an object, a common prefix).
    entries: [&'static [u8]; 2],
    /// The elements holding an entry's key, children of the entry.
    keys: [&'static [u8]; 2],
    /// The element holding the next page's token, a child of the root.
    next: &'static [u8],
}

/// S3's and GCS's `ListObjectsV2`: `Contents/Key`, `CommonPrefixes/Prefix`.
const LIST_OBJECTS_V2: Dialect = Dialect {
    depth: 1,
    entries: [b"Contents", b"CommonPrefixes"],
    keys: [b"Key", b"Prefix"],
    next: b"NextContinuationToken",
};

/// Azure's `List Blobs`: `Blobs/Blob/Name`, `Blobs/BlobPrefix/Name`.
const LIST_BLOBS: Dialect = Dialect {
    depth: 2,
    entries: [b"Blob", b"BlobPrefix"],
    keys: [b"Name", b"Name"],
    next: b"NextMarker",
};

/// Whether a request asks for a listing page, in which dialect, and the token it asks with:
/// `None` for a request that is not a listing page, `Some((_, None))` for a first page.
pub(crate) fn list_request(uri: &http::Uri) -> Option<(Dialect, Option<String>)> {
    let query = uri.query()?;
    let (mut v2, mut blobs) = (false, false);
    let (mut token, mut marker) = (None, None);
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "list-type" if v == "2" => v2 = true,
            "comp" if v == "list" => blobs = true,
            "continuation-token" => token = Some(v.into_owned()),
            "marker" => marker = Some(v.into_owned()).filter(|m: &String| !m.is_empty()),
            _ => {}
        }
    }
    match (v2, blobs) {
        (true, _) => Some((LIST_OBJECTS_V2, token)),
        (false, true) => Some((LIST_BLOBS, marker)),
        _ => None,
    }
}

/// Keys already logged as left out (each is said once per daemon, however often listed).
static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn log_once(key: &str, why: &str) {
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if logged
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string())
    {
        log::warn!("key {key:?} left out of the listing: it holds {why}");
    }
}

/// Why `key` (a listed key, or a common prefix ending in `/`) cannot be an `object_store`
/// path, if it cannot.
fn unfit(key: &str) -> Option<&'static str> {
    ObjectPath::parse(key).err()?;
    let trimmed = key.strip_prefix('/').unwrap_or(key);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let parts = || trimmed.split('/');
    Some(if parts().any(|p| p.is_empty()) {
        "an empty path segment (`//`)"
    } else if parts().any(|p| p == "." || p == "..") {
        "a `.` or `..` path segment"
    } else if key.chars().any(|c| c.is_ascii_control()) {
        "a control character"
    } else {
        "not a path loosefs can show"
    })
}

/// `body` (one listing page of `dialect`, asked for with token `asked`) with every entry
/// whose key no path can hold cut out: `Ok(None)` when nothing is cut (pass the body on as it
/// is). Errors: the page repeats `asked` as its next token. A body that is not such XML is
/// passed on (`Ok(None)`): `object_store` names it.
pub(crate) fn tidy(
    body: &[u8],
    dialect: Dialect,
    asked: Option<&str>,
) -> Result<Option<Vec<u8>>, String> {
    let d = dialect;
    // Azure starts its pages with a UTF-8 byte-order mark, which the reader skips without
    // counting it: positions are taken after it, and it is kept in the output.
    let (bom, body) = match body.strip_prefix(b"\xEF\xBB\xBF".as_slice()) {
        Some(rest) => (&body[..3], rest),
        None => (&body[..0], body),
    };
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut cut: Vec<Range<usize>> = Vec::new();
    let (mut entry_start, mut text_start) = (0, 0);
    let mut entry_key: Option<String> = None;
    loop {
        let before = reader.buffer_position() as usize;
        let event = match reader.read_event() {
            Ok(e) => e,
            Err(_) => return Ok(None),
        };
        let after = reader.buffer_position() as usize;
        match event {
            Event::Start(e) => {
                let name = e.name().as_ref().to_vec();
                if path.len() == d.depth && d.entries.contains(&name.as_slice()) {
                    entry_start = before;
                    entry_key = None;
                }
                path.push(name);
                text_start = after;
            }
            Event::End(_) => {
                let name = path.pop().unwrap_or_default();
                let raw = std::str::from_utf8(&body[text_start.min(before)..before]).ok();
                let text = raw.and_then(|r| quick_xml::escape::unescape(r).ok());
                let name = name.as_slice();
                let depth = path.len();
                if depth == d.depth + 1 && d.keys.contains(&name) {
                    entry_key = text.map(|t| t.into_owned());
                } else if depth == d.depth && d.entries.contains(&name) {
                    let Some(key) = entry_key.take() else {
                        continue;
                    };
                    if let Some(why) = unfit(&key) {
                        log_once(&key, why);
                        cut.push(entry_start..after);
                    }
                } else if depth == 1
                    && name == d.next
                    && let (Some(next), Some(asked)) = (text, asked)
                    && next == asked
                {
                    return Err(format!(
                        "the server answered the listing's continuation token {asked:?} with \
                         itself: it would be listed forever"
                    ));
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if cut.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(bom.len() + body.len());
    out.extend_from_slice(bom);
    let mut at = 0;
    for r in cut {
        out.extend_from_slice(&body[at..r.start]);
        at = r.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(keys: &[&str], prefixes: &[&str], next: Option<&str>) -> String {
        let mut s = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
             xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>d/</Prefix>",
        );
        for k in keys {
            s += &format!(
                "<Contents><Key>{}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>\
                 <ETag>&quot;x&quot;</ETag><Size>3</Size></Contents>",
                quick_xml::escape::escape(*k)
            );
        }
        for p in prefixes {
            s += &format!("<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>");
        }
        if let Some(n) = next {
            s += &format!("<NextContinuationToken>{n}</NextContinuationToken>");
        }
        s + "</ListBucketResult>"
    }

    #[test]
    fn keys_no_path_can_hold_are_cut_and_the_rest_kept_byte_for_byte() {
        let good = page(&["d/a.txt", "d/caf\u{e9} & co.txt"], &["d/sub/"], None);
        assert_eq!(tidy(good.as_bytes(), LIST_OBJECTS_V2, None).unwrap(), None);
        let bad = page(
            &[
                "d/a.txt",
                "d//b.txt",
                "d/../x.txt",
                "d/c\u{1}.txt",
                "d/z.txt",
            ],
            &["d/sub/", "d//"],
            Some("t1"),
        );
        let out = String::from_utf8(
            tidy(bad.as_bytes(), LIST_OBJECTS_V2, None)
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            out,
            page(&["d/a.txt", "d/z.txt"], &["d/sub/"], Some("t1")),
            "{out}"
        );
    }

    #[test]
    fn a_page_that_repeats_its_token_is_refused_and_requests_are_told_apart() {
        let p = page(&["d/a.txt"], &[], Some("abc"));
        assert!(
            tidy(p.as_bytes(), LIST_OBJECTS_V2, Some("abc"))
                .unwrap_err()
                .contains("forever")
        );
        assert_eq!(
            tidy(p.as_bytes(), LIST_OBJECTS_V2, Some("xyz")).unwrap(),
            None
        );
        assert_eq!(tidy(b"not xml <<", LIST_OBJECTS_V2, None).unwrap(), None);
        let uri: http::Uri = "http://h/b?list-type=2&prefix=d%2F&continuation-token=a%2Bb"
            .parse()
            .unwrap();
        assert_eq!(
            list_request(&uri),
            Some((LIST_OBJECTS_V2, Some("a+b".into())))
        );
        let uri: http::Uri = "http://h/b?list-type=2&prefix=d%2F".parse().unwrap();
        assert_eq!(list_request(&uri), Some((LIST_OBJECTS_V2, None)));
        let uri: http::Uri = "http://h/b/d/a.txt".parse().unwrap();
        assert_eq!(list_request(&uri), None);
        let uri: http::Uri = "http://h/acct/c?restype=container&comp=list&prefix=d%2F&marker=m1"
            .parse()
            .unwrap();
        assert_eq!(list_request(&uri), Some((LIST_BLOBS, Some("m1".into()))));
    }

    /// An Azure `List Blobs` page (its shape as Azurite and the service answer it, byte-order
    /// mark first).
    fn blobs_page(keys: &[&str], prefixes: &[&str], next: &str) -> String {
        let mut s = String::from(
            "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults \
             ServiceEndpoint=\"http://h/acct\" ContainerName=\"c\"><Prefix>d/</Prefix>\
             <Delimiter>/</Delimiter><Blobs>",
        );
        for k in keys {
            s += &format!(
                "<Blob><Name>{}</Name><Properties><Etag>0x1</Etag>\
                 <Content-Length>3</Content-Length></Properties></Blob>",
                quick_xml::escape::escape(*k)
            );
        }
        for p in prefixes {
            s += &format!("<BlobPrefix><Name>{p}</Name></BlobPrefix>");
        }
        s + &format!("</Blobs><NextMarker>{next}</NextMarker></EnumerationResults>")
    }

    #[test]
    fn azure_pages_are_tidied_the_same_way() {
        let bad = blobs_page(&["d/a.txt", "d//b.txt", "d/../x"], &["d/s/", "d//"], "");
        let out = tidy(bad.as_bytes(), LIST_BLOBS, None).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            blobs_page(&["d/a.txt"], &["d/s/"], "")
        );
        let p = blobs_page(&["d/a.txt"], &[], "m1");
        assert!(tidy(p.as_bytes(), LIST_BLOBS, Some("m1")).is_err());
        assert_eq!(tidy(p.as_bytes(), LIST_BLOBS, None).unwrap(), None);
    }
}
