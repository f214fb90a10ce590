//! Fuzz target: the JPEG header probe `loosefs pack` runs on every file.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::jpeg(data));
}
