//! Fuzz target: a mds dataset (scan, then the index build), from one input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        loosefs_fuzz::scan_dataset(
            loosefs::formats::Format::Mds,
            data,
            &["index.json", "shard.00000.mds"],
            false,
        );
    });
}
