//! Fuzz target: a compressed chunk's decompression against the length and CRC its container
//! declares (first byte: zstd or deflate; next 8: the declared length, up to 2^64−1; the rest:
//! the stream). A bomb or a lying length must be refused without allocating what it claims.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::chunk(data));
}
