//! `docs/DESIGN.md`'s module map names every file and folder under `src/` by its whole path,
//! and nothing else: a module added, moved or renamed without its line in the map fails here
//! (a new `storage/object/client.rs` is not covered by an older `client.rs` elsewhere).

use std::path::Path;

/// The map: the first fenced block after `## Modules`.
fn module_map() -> String {
    let design = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/DESIGN.md"))
        .expect("docs/DESIGN.md");
    let at = design.find("## Modules").expect("a ## Modules section");
    let rest = &design[at..];
    let start = rest.find("```").expect("a fenced block") + 3;
    let end = start + rest[start..].find("```").expect("its end");
    rest[start..end].to_string()
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = format!("{rel}{name}");
        if e.file_type().unwrap().is_dir() {
            out.push(format!("{path}/"));
            walk(&e.path(), &format!("{path}/"), out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Every path the map names, whole: a line's first word ending in `.rs` or `/` is a file or
/// a folder, relative to the folder of the nearest line above it indented less (a folder
/// line's own path, or a file line's folder): `fs/` then `  mod.rs` is `fs/mod.rs`; `fuse.rs`
/// then `  fuse/uring.rs` then `    uring/abi.rs` is `fuse/uring/abi.rs`. Continuation lines
/// (indented further, their first word no path) name nothing.
fn named_paths(map: &str) -> Vec<String> {
    let mut out = Vec::new();
    // (indent, full path) of the lines that name a path, innermost last.
    let mut above: Vec<(usize, String)> = Vec::new();
    for line in map.lines() {
        let indent = line.len() - line.trim_start().len();
        let Some(word) = line.split_whitespace().next() else {
            continue;
        };
        let word = word.trim_end_matches([',', ';']);
        if !(word.ends_with(".rs") || word.ends_with('/')) {
            continue;
        }
        while above.last().is_some_and(|(i, _)| *i >= indent) {
            above.pop();
        }
        let folder = match above.last() {
            Some((_, p)) if p.ends_with('/') => p.clone(),
            Some((_, p)) => p.rfind('/').map_or(String::new(), |k| p[..=k].to_string()),
            None => String::new(),
        };
        let full = format!("{folder}{word}");
        out.push(full.clone());
        above.push((indent, full));
    }
    out
}

#[test]
fn the_module_map_names_every_file_and_folder_of_src_by_its_whole_path() {
    let map = module_map();
    let mut paths = Vec::new();
    walk(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        "",
        &mut paths,
    );
    assert!(paths.len() > 50, "{paths:?}");
    let named = named_paths(&map);
    // A folder is named by its own line or by the paths below it.
    let missing: Vec<&String> = (paths.iter())
        .filter(|p| {
            let below = p.ends_with('/') && named.iter().any(|n| n.starts_with(*p));
            !(named.contains(p) || below)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md's module map does not name (by whole path): {missing:?}"
    );
    let stale: Vec<&String> = named.iter().filter(|p| !paths.contains(p)).collect();
    assert!(
        stale.is_empty(),
        "docs/DESIGN.md's module map names what src/ does not hold: {stale:?}"
    );
}

#[test]
fn paths_are_read_relative_to_the_line_above_them() {
    let map = "lib.rs  x\nfuse.rs  y\n  fuse/uring.rs  z\n    uring/abi.rs  w\n          more words\nfs/\n  mod.rs  v\n";
    assert_eq!(
        named_paths(map),
        [
            "lib.rs",
            "fuse.rs",
            "fuse/uring.rs",
            "fuse/uring/abi.rs",
            "fs/",
            "fs/mod.rs"
        ]
    );
}

/// DESIGN's format table ("## Adding a format"): one row per format, its cells split.
fn format_table() -> Vec<Vec<String>> {
    let design = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/DESIGN.md"))
        .expect("docs/DESIGN.md");
    let at = design
        .find("## Adding a format")
        .expect("an ## Adding a format section");
    let end = at + 3 + design[at + 3..].find("\n## ").expect("the next section");
    design[at..end]
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| format"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn designs_format_table_is_the_registrys() {
    use loosefs::formats::Format;
    let list = |v: &[&str]| v.join(", ");
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let want: Vec<Vec<String>> = Format::ALL
        .iter()
        .map(|f| {
            vec![
                f.name().to_string(),
                list(f.aliases()),
                yes(f.takes_label()),
                yes(f.is_directory_dataset()),
                list(f.shard_extensions()),
            ]
        })
        .collect();
    let mut got = format_table();
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "docs/DESIGN.md's format table against formats/registry.rs"
    );
}
