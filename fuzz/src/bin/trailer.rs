//! Fuzz target: the tail of a pack (the loosefs trailer in the zip comment).
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::trailer(data));
}
