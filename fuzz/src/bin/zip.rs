//! Fuzz target: a zip dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(loosefs::formats::Format::Zip, data, &["images.zip"], true);
    });
}
