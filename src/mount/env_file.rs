//! The store settings and credentials a site gives a daemon by a file (`loosefs mount
//! --env-file FILE`): the Slurm prolog opens a root-owned file and hands it as a descriptor
//! (`--env-file /dev/fd/4`) to the daemon it starts as the job's user, whose environment it
//! reset, so that the values reach the daemon's environment (readable by that user and root
//! alone) and never a command line (world-readable) or a log.
//!
//! Format: one `NAME=VALUE` per line, as systemd's `EnvironmentFile=` and Docker's `--env-file`
//! take it (no quotes, no expansion: the value is the rest of the line); blank lines and lines
//! starting with `#` are skipped. Only the variables the stores read are taken (the
//! allow-list, [`ALLOWED`]): a line naming another is refused, so the file cannot set `PATH`,
//! `LD_PRELOAD` or `HOME` for the daemon. A variable already in the environment is kept; the
//! file's `LOOSEFS_*` variables act as the options' own (`main` reads the command line again).

use anyhow::{Context, Result, bail};
use std::path::Path;

/// The names a file may set: the clouds' SDK variables (`AWS_*`, `GOOGLE_*`, `GCE_METADATA_*`,
/// `AZURE_*`, `STORAGE_EMULATOR_HOST`) and loosefs's own options (`LOOSEFS_*`).
pub const ALLOWED: [&str; 6] = [
    "AWS_",
    "GOOGLE_",
    "GCE_METADATA_",
    "AZURE_",
    "STORAGE_EMULATOR_HOST",
    "LOOSEFS_",
];

/// The descriptor `N` of `/dev/fd/N` (or `/proc/self/fd/N`): a file handed open, read through
/// the descriptor itself. Opening that path again would check the file's own permissions,
/// which refuse the job's user a file only root may read: the point of handing it open.
fn handed_fd(path: &Path) -> Option<i32> {
    let s = path.to_str()?;
    let n = s
        .strip_prefix("/dev/fd/")
        .or_else(|| s.strip_prefix("/proc/self/fd/"))?;
    n.parse().ok().filter(|n: &i32| *n >= 0)
}

/// The whole of the file open at `fd`, read from its start with `pread` (its offset untouched:
/// a daemon the keeper starts again reads it again).
fn read_fd(fd: i32) -> std::io::Result<Vec<u8>> {
    // SAFETY: `fd` is only read with `pread` while this function runs and is not closed; a
    // number that is not an open descriptor makes `pread` fail with EBADF, said as an error.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = nix::sys::uio::pread(fd, &mut buf, out.len() as i64)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() > 1 << 20 {
            return Err(std::io::Error::other("larger than 1 MiB"));
        }
    }
}

/// Whether `name` may be set from a file.
fn allowed(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && ALLOWED.iter().any(|p| name.starts_with(p))
}

/// The variables of `path`, in order. Errors: the file cannot be read, or a line is not
/// `NAME=VALUE` with an allowed name; each names the file and the line number, never a value
/// (it may be a secret).
pub fn read(path: &Path) -> Result<Vec<(String, String)>> {
    let text = match handed_fd(path) {
        Some(fd) => read_fd(fd),
        None => std::fs::read(path),
    }
    .with_context(|| format!("cannot read the environment file {}", path.display()))?;
    let text = String::from_utf8(text)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            bail!("{} line {}: not NAME=VALUE", path.display(), i + 1);
        };
        let name = name.trim();
        if !allowed(name) {
            bail!(
                "{} line {}: {name:?} is not a store's variable (allowed: {}*)",
                path.display(),
                i + 1,
                ALLOWED.join("*, ")
            );
        }
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_variables_are_taken_and_anything_else_refused_naming_the_line_not_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("env");
        std::fs::write(
            &f,
            "# site credentials\n\nAWS_SECRET_ACCESS_KEY=s3cr=t\nSTORAGE_EMULATOR_HOST=h:1\n",
        )
        .unwrap();
        assert_eq!(
            read(&f).unwrap(),
            [
                ("AWS_SECRET_ACCESS_KEY".to_string(), "s3cr=t".to_string()),
                ("STORAGE_EMULATOR_HOST".to_string(), "h:1".to_string())
            ]
        );
        // Handed open, read through the descriptor (from its start, whatever its offset).
        let file = std::fs::File::open(&f).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        assert_eq!(read(Path::new(&format!("/dev/fd/{fd}"))).unwrap().len(), 2);
        assert_eq!(read(Path::new(&format!("/dev/fd/{fd}"))).unwrap().len(), 2);
        for bad in ["LD_PRELOAD=/x.so\n", "AWS_KEY\n", "PATH=/evil\n"] {
            std::fs::write(&f, format!("AWS_REGION=x\n{bad}")).unwrap();
            let e = read(&f).unwrap_err().to_string();
            assert!(
                e.contains("line 2") && !e.contains("/evil") && !e.contains("/x.so"),
                "{e}"
            );
        }
    }
}
