//! Fuzz target: a shared index of a remote dataset (`loosefs index s3://…`, fetched by every
//! node that mounts the dataset): checked for a dataset URL against a listing of four objects,
//! and without a listing (HTTPS: names and pins taken from the index), so the header's
//! recorded objects, the names the samples come from and the index inside are all explored.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::remote_shared(data));
}
