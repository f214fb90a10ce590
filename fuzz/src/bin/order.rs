//! Fuzz target: announced orders (what any user of a mount may write to `.loosefs/order`).
//! One server over a small pack lives for the whole run; each input is written as one
//! announcement: byte 0 sets the write size (1–256 bytes), byte 1 the writing process, and
//! byte 2 = 0xff restarts at a wrong offset once. Some files are then read, so the reads meet
//! the order. Errors are expected; a panic, a hang or unbounded growth is a finding.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::order(data));
}
