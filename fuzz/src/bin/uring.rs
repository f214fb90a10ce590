//! Fuzz target: requests as the kernel hands them to a FUSE-over-io_uring ring entry,
//! answered by the ring's handler over one in-process server (`fuse::uring::Handler`). The
//! input is the entry's 288-byte header buffer (zero-padded) followed by its payload; a node
//! id of 2..=65 is replaced by file k − 2's inode, so lookups, reads, listings and writes to
//! `.loosefs/order` meet real nodes. Errors are expected; a panic, a hang, a reply longer than
//! its buffer or than the request's size is a finding.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::uring(data));
}
