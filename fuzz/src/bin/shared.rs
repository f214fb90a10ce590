//! Fuzz target: a shared index file (`loosefs index`, read by every node that mounts the
//! dataset): loaded for a dataset directory holding one file, with the options it names, so
//! the header, the object table, the relative names and the index inside are all explored.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::shared(data));
}
