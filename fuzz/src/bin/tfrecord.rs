//! Fuzz target: a tfrecord dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(
            loosefs::formats::Format::Tfrecord,
            data,
            &["train-00000-of-00001"],
            true,
        );
    });
}
