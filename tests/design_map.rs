//! `docs/DESIGN.md`'s module map names every file and folder under `src/`: a module added,
//! moved or renamed without its line in the map fails here.

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

#[test]
fn the_module_map_names_every_file_and_folder_of_src() {
    let map = module_map();
    let mut paths = Vec::new();
    walk(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        "",
        &mut paths,
    );
    assert!(paths.len() > 50, "{paths:?}");
    // Each path's last component (a file, or a folder with its slash) is named in the map.
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            let last = p.trim_end_matches('/').rsplit('/').next().unwrap();
            let token = if p.ends_with('/') {
                format!("{last}/")
            } else {
                last.to_string()
            };
            !map.contains(&token)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md's module map does not name: {missing:?}"
    );
}
