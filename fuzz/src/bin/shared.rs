//! Fuzz target: a shared index file (`loosefs index`, read by every node that mounts the
//! dataset): loaded for a dataset directory holding one file, with the options it names, so
//! the header, the object table, the relative names and the index inside are all explored.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        let dir = tempfile::tempdir().expect("temp dir");
        let src = dir.path().join("ds");
        std::fs::create_dir(&src).expect("dataset dir");
        std::fs::write(src.join("shard-000000.tar"), b"data").expect("a file");
        let path = dir.path().join("ds.loosefs-index");
        std::fs::write(&path, data).expect("write the index");
        let options = loosefs::formats::index::load(&path)
            .map(|f| vec![f.header.options])
            .unwrap_or_default();
        if let Ok(Some(f)) = loosefs::formats::index::shared::load(&path, &src, &options) {
            let n = loosefs_fuzz::walk(&f.view());
            assert!(n as u64 + 1 <= f.view().totals().records);
            assert!(f.header.objects.iter().all(|o| o.path.starts_with(&src)));
        }
    });
}
