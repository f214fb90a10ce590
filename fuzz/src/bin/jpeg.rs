//! Fuzz target: the JPEG header probe `loosefs pack` runs on every file.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = loosefs::pack::jpeg::probe(data);
    });
}
