//! A remote store's failures said in words: `object_store`'s error with the causes under it,
//! a store's XML error document put in words with what to check, and the `io::ErrorKind` the
//! read path and the openers need (404 `NotFound`, 401/403 `PermissionDenied`).

use super::{fail_fast, stores};
use std::io;

/// `e` with the causes under it (`object_store` shows only its outermost one, "error sending
/// request", where the cause is an untrusted certificate or a refused connection), each said
/// once, and what to do where the cause is known: an untrusted certificate names
/// `--ca-bundle`.
pub(super) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out += ": ";
            out += &s;
        }
        cur = c.source();
    }
    if let Some(said) = server_error(&out) {
        out = said;
    }
    let low = out.to_ascii_lowercase();
    if let Some(hint) = stores::STORES.iter().find_map(|s| s.credentials_hint(&low)) {
        out = format!("{hint}: {out}");
    } else if low.contains("certificate") || low.contains("unknownissuer") {
        out = format!("{out} ({})", fail_fast::CERTIFICATE_FIX);
    } else if low.contains("connection refused") && !low.contains("tried, in order") {
        // (Not where a credential source refused: the message names each one.)
        out += " (nothing listens at that address and port: check the URL or --endpoint-url)";
    }
    out
}

/// `text` with the XML error document a store answered (S3's, GCS's and Azure's
/// `<Error><Code>…</Code><Message>…</Message>…`) put in words: the document cut, its code and
/// message said once, and what to check for the codes whose fix is known. `None`: no such
/// document in `text`.
fn server_error(text: &str) -> Option<String> {
    let start = text.find("<?xml").or_else(|| text.find("<Error>"))?;
    let field = |name: &str| {
        let open = format!("<{name}>");
        let from = text[start..].find(&open)? + start + open.len();
        let to = text[from..].find(&format!("</{name}>"))? + from;
        Some(text[from..to].trim().to_string())
    };
    let code = field("Code")?;
    let message = field("Message").unwrap_or_default();
    let fix = match code.as_str() {
        "NoSuchBucket" | "ContainerNotFound" => {
            "no such bucket or container: check its name in the URL, and --endpoint-url"
        }
        "AccessDenied" | "AuthorizationFailure" | "AuthorizationPermissionMismatch" => {
            "access denied: check the credentials and what they may read (a Requester Pays S3 \
             bucket also needs --request-payer)"
        }
        "UserProjectMissing" => {
            "a Requester Pays bucket: give the Google Cloud project to bill with \
             --billing-project PROJECT"
        }
        "PermanentRedirect" | "AuthorizationHeaderMalformed" => {
            "the bucket is in another region than the one signed for: give --region"
        }
        "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AuthenticationFailed" => {
            "the credentials were refused: check the key and secret"
        }
        "NoSuchKey" | "BlobNotFound" => "no such object",
        "ExpiredToken" | "TokenRefreshRequired" | "InvalidToken" => {
            "the credentials' session token has expired: renew it (`aws sso login`, `gcloud \
             auth application-default login`, `az login`) and mount again"
        }
        _ => "",
    };
    let head = text[..start].trim_end().trim_end_matches(':');
    let said = match message.is_empty() {
        true => code.clone(),
        false => format!("{code}, \"{message}\""),
    };
    Some(match fix.is_empty() {
        true => format!("{head}: the server answered {said}"),
        false => format!("{head}: {fix} (the server answered {said})"),
    })
}

/// Why a GET failed, as the read path needs it.
pub(super) fn io_error(url: &str, e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    let kind = match &e {
        E::NotFound { .. } => io::ErrorKind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{url}: {}", describe(&e)))
}

/// The kind of the I/O error inside `e` (from [`ObjectClient::fetch_to`]): `NotFound` for
/// 404, `PermissionDenied` for 401/403, `Other` for the rest; `None` when `e` holds none
/// (a local file that cannot be written).
pub fn error_kind(e: &anyhow::Error) -> Option<io::ErrorKind> {
    e.downcast_ref::<io::Error>().map(io::Error::kind)
}

#[cfg(test)]
mod tests {
    use super::server_error;

    #[test]
    fn a_stores_xml_error_is_said_in_words() {
        let e = "Generic S3 error: Error performing GET http://h/b?list-type=2 in 2ms - Server \
                 returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\" \
                 encoding=\"UTF-8\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified \
                 bucket does not exist</Message><BucketName>b</BucketName><HostId>x</HostId></Error>";
        let said = server_error(e).unwrap();
        assert!(!said.contains('<'), "{said}");
        assert!(
            said.ends_with(
                "404 Not Found: no such bucket or container: check its name in the URL, and \
                 --endpoint-url (the server answered NoSuchBucket, \"The specified bucket does not \
                 exist\")"
            ),
            "{said}"
        );
        let azure =
            "...: 403 Forbidden: \u{feff}<?xml version=\"1.0\"?><Error><Code>Odd</Code></Error>";
        assert!(
            server_error(azure)
                .unwrap()
                .ends_with("the server answered Odd")
        );
        assert_eq!(server_error("connection refused"), None);
        let expired = "...: 400 Bad Request: <Error><Code>ExpiredToken</Code><Message>The provided \
                       token has expired.</Message></Error>";
        assert!(
            server_error(expired)
                .unwrap()
                .contains("session token has expired: renew it")
        );
    }
}
