//! Fuzz target: a tar dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(
            loosefs::formats::Format::Tar,
            data,
            &["shard-000000.tar"],
            true,
        );
    });
}
