//! Fuzz target: a JPEG decoded for a view (`--decode npy|ppm`): probe, scale, decode under
//! the daemon's policy, and the view files built from the pixels.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::decode(data));
}
