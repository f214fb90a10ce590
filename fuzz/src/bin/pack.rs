//! Fuzz target: a whole pack file, as `mount`, `info` and `verify` read it: open (trailer,
//! index, tree), verify (every sample's CRC-32, the zip central directory and local headers),
//! and the walk the daemon's lookups and listings do. The file lives in /dev/shm when it can.
fn main() {
    let dir = tempfile::Builder::new()
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temp dir");
    let path = dir.path().join("f.pack");
    afl::fuzz!(|data: &[u8]| {
        if std::fs::write(&path, data).is_err() {
            return;
        }
        let Ok(pack) = loosefs::pack::reader::Pack::open(&path) else {
            return;
        };
        let _ = loosefs::verify::verify(&pack, None);
        loosefs_fuzz::walk(&pack.index());
    });
}
