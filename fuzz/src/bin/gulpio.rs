//! Fuzz target: a gulpio dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(
            loosefs::formats::Format::Gulpio,
            data,
            &["meta_0.gmeta", "data_0.gulp", "label2idx.json"],
            false,
        );
    });
}
