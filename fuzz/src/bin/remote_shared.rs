//! Fuzz target: a shared index of a remote dataset (`loosefs index s3://…`, fetched by every
//! node that mounts the dataset): checked for a dataset URL against a listing of four objects,
//! and without a listing (HTTPS: names and pins taken from the index), so the header's
//! recorded objects, the names the samples come from and the index inside are all explored.
use loosefs::storage::object::Pin;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("i.loosefs-index");
        std::fs::write(&path, data).expect("write the index");
        let args = loosefs::open::OpenOptions {
            shared_index: Some(path.clone()),
            ..Default::default()
        };
        // The seed's objects (scripts/fuzz): each of size 4, ETag `"i"`.
        let names: Vec<String> = [
            "index.json",
            "shard.00000.mds",
            "shard.00001.mds",
            "shard.00002.mds",
        ]
        .map(String::from)
        .to_vec();
        let pins: Vec<Option<Pin>> = (0..names.len())
            .map(|i| {
                Some(Pin {
                    size: 4,
                    etag: format!("\"{i}\""),
                    version: None,
                })
            })
            .collect();
        let at = (path.to_str().expect("utf-8"), true);
        let url = "s3://b/d/";
        for listed in [Some((&names[..], &pins[..])), None] {
            let checked = loosefs::open::remote_dataset::shared::check(&path, at, url, &args, listed);
            if let Ok(Some((n, p, f))) = checked {
                assert_eq!(n.len(), p.len());
                let walked = loosefs_fuzz::walk(&f.view());
                assert!(walked as u64 + 1 <= f.view().totals().records);
                if listed.is_some() {
                    assert_eq!(n, names);
                }
                assert!(
                    n.iter()
                        .all(|x| !x.starts_with('/') && !x.split('/').any(|c| c == ".."))
                );
            }
        }
    });
}
