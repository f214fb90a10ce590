//! Fuzz target: a directory listing an HTTP server answers (nginx's JSON) and a shared listing
//! of loose objects (`LOOSEFSL`): parsed or decoded, then checked as a mount checks them.
fn main() {
    afl::fuzz!(|data: &[u8]| loosefs_fuzz::targets::listing(data));
}
