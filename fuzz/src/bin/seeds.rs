//! Writes starting corpora for the fuzz targets from a real pack and real JPEGs:
//! `seeds OUT_DIR PACK [JPEG...]` → `OUT_DIR/{index,trailer,pack,jpeg}/…`.
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() >= 3, "usage: seeds OUT_DIR PACK [JPEG...]");
    let out = Path::new(&args[1]);
    let pack = std::fs::read(&args[2]).expect("read the pack");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let d = out.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    };
    let tail = &pack[pack.len().saturating_sub(4096)..];
    let t = loosefs::pack::trailer::Trailer::parse_tail(tail).expect("a loosefs pack");
    let ix = &pack[t.index_offset as usize..(t.index_offset + t.index_len) as usize];
    write("index", "real", ix);
    write("trailer", "real", tail);
    write("pack", "real", &pack);
    for (k, j) in args[3..].iter().enumerate() {
        write("jpeg", &format!("real{k}"), &std::fs::read(j).unwrap());
    }
}
