//! Which object store a URL names: the registry of every store loosefs reads, one file each
//! ([`super::s3`], [`super::gcs`], [`super::azure`], [`super::http`], all implementing
//! [`Store`]). A URL is claimed by exactly one store, asked in the order of [`STORES`];
//! elsewhere code asks the store, never a scheme string (a test,
//! `scheme_strings_live_in_the_store_files`, holds the code to it).
//!
//! Adding a store (DESIGN "Adding an object store"): a file beside this one implementing
//! [`Store`], and its line in [`STORES`].

use super::store::Store;

/// Every store, asked in this order: Google's and Azure's own `https://` URLs before plain
/// HTTP(S).
pub(super) static STORES: [&dyn Store; 4] = [
    &super::s3::S3,
    &super::gcs::Gcs,
    &super::azure::Azure,
    &super::http::Http,
];

/// The store `url` names, if any.
pub(super) fn store_of(url: &str) -> Option<&'static dyn Store> {
    STORES.iter().copied().find(|s| s.claims(url))
}

/// Every URL form loosefs reads, for messages: "s3://BUCKET/KEY, gs://BUCKET/KEY, …".
pub(super) fn all_forms() -> String {
    forms_of(|_| true)
}

/// The URL forms indexes and packs can be written to (bucket stores), for messages.
pub(super) fn bucket_forms() -> String {
    forms_of(|s| s.is_bucket())
}

fn forms_of(keep: impl Fn(&dyn Store) -> bool) -> String {
    STORES
        .iter()
        .filter(|s| keep(**s))
        .flat_map(|s| s.forms().iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_url_has_one_store() {
        for (url, name) in [
            ("s3://b/k", "S3"),
            ("S3://b/k", "S3"),
            ("gs://b/k", "GCS"),
            ("az://c/k", "Azure"),
            ("abfss://c@acct.dfs.core.windows.net/k", "Azure"),
            ("https://acct.blob.core.windows.net/c/k", "Azure"),
            ("https://storage.googleapis.com/b/k", "GCS"),
            ("https://h/k", "HTTP"),
            ("http://h/k", "HTTP"),
        ] {
            let claimed: Vec<_> = STORES.iter().filter(|s| s.claims(url)).collect();
            assert!(!claimed.is_empty(), "{url}");
            assert_eq!(store_of(url).unwrap().name(), name, "{url}");
        }
        for not in ["/data/x", "ftp://h/x", "s3://", "gs:/b/k", "é"] {
            assert!(store_of(not).is_none(), "{not}");
        }
    }

    /// The scheme strings of the stores appear in their own files only (outside tests and
    /// comments): elsewhere, code asks the store ([`store_of`]) what the URL is.
    #[test]
    fn scheme_strings_live_in_the_store_files() {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let own = ["s3.rs", "gcs.rs", "azure.rs", "http.rs", "stores.rs"];
        let schemes = [
            "s3://",
            "gs://",
            "az://",
            "abfs",
            "azure://",
            "windows.net",
            "googleapis",
        ];
        let mut found = Vec::new();
        let mut stack = vec![here.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    if !p.ends_with("tests") {
                        stack.push(p);
                    }
                    continue;
                }
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                let in_object = p.parent().is_some_and(|d| d.ends_with("storage/object"));
                if !name.ends_with(".rs")
                    || name == "tests.rs"
                    || (in_object && own.contains(&name.as_str()))
                {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (n, line) in lines.iter().enumerate() {
                    // An inline test module ends the code (a `mod tests;` line does not).
                    let next = lines.get(n + 1).map_or("", |l| l.trim_end());
                    if line.trim_start() == "#[cfg(test)]"
                        && next.ends_with('{')
                        && next.contains("mod ")
                    {
                        break;
                    }
                    if line.trim_start().starts_with("//") {
                        continue;
                    }
                    if schemes
                        .iter()
                        .any(|s| line.to_ascii_lowercase().contains(s))
                    {
                        found.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "scheme strings outside the store files:\n{}",
            found.join("\n")
        );
    }
}
