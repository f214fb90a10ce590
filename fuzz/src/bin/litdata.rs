//! Fuzz target: a litdata dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(
            loosefs::formats::Format::Litdata,
            data,
            &["index.json", "chunk-0-0.bin"],
            false,
        );
    });
}
