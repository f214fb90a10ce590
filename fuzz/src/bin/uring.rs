//! Fuzz target: requests as the kernel hands them to a FUSE-over-io_uring ring entry,
//! answered by the ring's handler over one in-process server (`fuse::uring::Handler`). The
//! input is the entry's 288-byte header buffer (zero-padded) followed by its payload; a node
//! id of 2..=65 is replaced by file k − 2's inode, so lookups, reads, listings and writes to
//! `.loosefs/order` meet real nodes. Errors are expected; a panic, a hang, a reply longer than
//! its buffer or than the request's size is a finding.
use loosefs::fuse::uring::{Handler, abi};
use loosefs_fuzz::small_server;
use std::sync::{Arc, OnceLock};

fn handler() -> &'static Handler {
    static H: OnceLock<Handler> = OnceLock::new();
    H.get_or_init(|| {
        let (s, ..) = small_server();
        Handler::new(Arc::clone(s), 0, 0)
    })
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let (_, _, files) = small_server();
        let mut header = [0u8; abi::HEADER_LEN];
        let n = data.len().min(abi::HEADER_LEN);
        header[..n].copy_from_slice(&data[..n]);
        let node = u64::from_le_bytes(header[16..24].try_into().unwrap());
        if (2..=65).contains(&node) {
            header[16..24].copy_from_slice(&files[node as usize - 2].to_le_bytes());
        }
        let mut payload = vec![0u8; 1 << 16];
        let rest = &data[n..];
        let m = rest.len().min(payload.len());
        payload[..m].copy_from_slice(&rest[..m]);
        let mut input = Vec::new();
        handler().serve_entry(&mut header, &mut payload, &mut input);
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
        assert!(len >= 16 && len - 16 <= payload.len(), "reply of {len} bytes");
    });
}
