//! Records the git commit the binary is built from (`LOOSEFS_COMMIT`: `loosefs --version`, the
//! `loosefs_build_info` metric), so a bug report names its build: the short hash, `-dirty`
//! when the work tree has changes, `unknown` outside a git checkout (a source archive).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).map_or("unknown".into(), |c| {
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        if dirty { format!("{c}-dirty") } else { c }
    });
    println!("cargo:rustc-env=LOOSEFS_COMMIT={commit}");
    // Built again when HEAD moves (a commit, a checkout), not on every build: only paths that
    // exist are named (a missing one would run this script every time).
    let git_dir = Path::new(".git");
    if git_dir.is_dir() {
        println!("cargo:rerun-if-changed=.git/HEAD");
        println!("cargo:rerun-if-changed=.git/index");
        if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD"))
            && let Some(r) = head.trim().strip_prefix("ref: ")
            && git_dir.join(r).exists()
        {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    } else {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
