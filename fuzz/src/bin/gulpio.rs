//! Fuzz target: a gulpio dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::gulpio(data));
}
