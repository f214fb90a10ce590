//! Fuzz target: a whole pack file, as `mount`, `info` and `verify` read it: open (trailer,
//! index, tree), verify (every sample's CRC-32, the zip central directory and local headers),
//! and the walk the daemon's lookups and listings do. The file lives in /dev/shm when it can.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::pack(data));
}
