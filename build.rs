//! Records the git commit the binary is built from (`LOOSEFS_COMMIT`: `loosefs --version`, the
//! `loosefs_build_info` metric), so a bug report names its build: the short hash, `unknown`
//! outside a git checkout (a source archive). Only `git rev-parse` runs: `git status` would
//! rewrite the index, and a build that watched the index would then never be up to date.
//!
//! Also compiles the CSI spec's `proto/csi.proto` into the gRPC server `loosefs csi` serves
//! (protox parses it in Rust, so no `protoc` need be installed; tonic-prost-build writes the code).

use std::path::Path;
use std::process::Command;

fn main() {
    csi_proto();
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LOOSEFS_COMMIT={commit}");
    // Built again when HEAD moves (a commit, a checkout), not on every build: only paths that
    // exist are named (a missing one would run this script every time).
    println!("cargo:rerun-if-changed=build.rs");
    let git_dir = Path::new(".git");
    if git_dir.join("HEAD").is_file() {
        println!("cargo:rerun-if-changed=.git/HEAD");
        if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD"))
            && let Some(r) = head.trim().strip_prefix("ref: ")
            && git_dir.join(r).is_file()
        {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    }
}

/// The CSI v1 messages and the Identity and Node servers, into `$OUT_DIR/csi.v1.rs`.
fn csi_proto() {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["proto/csi.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("proto/csi.proto: {e}"));
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("proto/csi.proto: cannot generate its code: {e}"));
}
