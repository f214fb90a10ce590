//! Fuzz target: a LeRobot v3 dataset's metadata and one MP4 (`--decode frames`): the metadata
//! read, the video indexed by demuxing, rows' frames chosen, the first and last GOPs decoded.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::video(data));
}
