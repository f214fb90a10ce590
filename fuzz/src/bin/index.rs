//! Fuzz target: index bytes (the `.loosefs-index` member). The checksum is recomputed over the
//! input first, so the fuzzer explores the structure a forger controls, not the hash.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::index(data));
}
