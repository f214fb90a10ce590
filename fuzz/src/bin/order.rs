//! Fuzz target: announced orders (what any user of a mount may write to `.loosefs/order`).
//! One server over a small pack lives for the whole run; each input is written as one
//! announcement: byte 0 sets the write size (1–256 bytes), byte 1 the writing process, and
//! byte 2 = 0xff restarts at a wrong offset once. Some files are then read, so the reads meet
//! the order. Errors are expected; a panic, a hang or unbounded growth is a finding.
use loosefs::fs::Fs;
use loosefs_fuzz::small_server;
use std::sync::Arc;

fn server() -> &'static (Arc<Fs>, u64, Vec<u64>) {
    small_server()
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let (s, order, files) = server();
        let [size, pid, wrong, rest @ ..] = data else {
            return;
        };
        let size = usize::from(*size) + 1;
        let mut off = 0u64;
        for (k, part) in rest.chunks(size).enumerate() {
            let at = if k == 1 && *wrong == 0xff {
                off + 1
            } else {
                off
            };
            if s.write(*order, at, part, u32::from(*pid)).is_ok() {
                off = at + part.len() as u64;
            }
        }
        for &ino in files.iter().skip(usize::from(*pid) % 8).step_by(3) {
            s.read(ino, 0, 4096, |_| {});
        }
    });
}
