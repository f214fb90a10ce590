//! The paths the kubelet hands the node plugin (a volume's staging path, a pod's target path),
//! checked in canonical form under the kubelet's directory with no link below it, and the
//! mounts found there: which are this volume's (`fuse.loosefs` of `loosefs:csi/VOLUME`, the
//! staged mount and every bind of it), whether one answers, and how only those are undone.

use super::NodeConfig;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;
use tonic::Status;

/// The mount source that names `volume_id`'s mounts (`loosefs:csi/VOLUME`; what `loosefs
/// umount` and the mount table show), with spaces and commas, which mount(2) would split on,
/// replaced.
pub(super) fn mount_source(volume_id: &str) -> String {
    let safe: String = volume_id
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == ',' {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("loosefs:csi/{safe}")
}

/// Checks a path the kubelet gave (a target or staging path, named `field` in errors): absolute, no `..`, under the kubelet directory; and
/// returns it in canonical form (no `.`, `//` or trailing `/`: the form the mount table shows,
/// so a publish or unpublish of `T/` finds the mount at `T`), under the kubelet directory's
/// real path. Errors: `INVALID_ARGUMENT`, as is any part of it below the kubelet directory that
/// is a symbolic link ([`no_links_below`]).
pub(super) fn check_target(
    config: &NodeConfig,
    target: &str,
    field: &str,
) -> Result<PathBuf, Status> {
    if target.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is missing")));
    }
    let path = PathBuf::from(target);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(Status::invalid_argument(format!(
            "{field} {target}: not an absolute path without `..`"
        )));
    }
    // `components()` drops `.`, repeated and trailing separators.
    let path: PathBuf = path.components().collect();
    let Ok(below) = path.strip_prefix(&config.kubelet_dir) else {
        return Err(Status::invalid_argument(format!(
            "{field} {target}: not under the kubelet directory {} (set --kubelet-dir where \
             this node's kubelet keeps its pods)",
            config.kubelet_dir.display()
        )));
    };
    if below.as_os_str().is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field} {target}: the kubelet directory itself"
        )));
    }
    // The kubelet directory may itself be reached through a link (a node that moved it); what
    // lies below it may not.
    let real = config.kubelet_root();
    let path = real.join(below);
    no_links_below(&real, &path)?;
    Ok(path)
}

/// Checks that no part of `path` below `root` (each directory that exists, and `path` itself)
/// is a symbolic link: the mount, its directories and its unmount then stay where the kubelet
/// asked, never outside its directory or over another pod's volume. Errors: `INVALID_ARGUMENT`
/// naming the link.
pub(super) fn no_links_below(root: &Path, path: &Path) -> Result<(), Status> {
    let Ok(below) = path.strip_prefix(root) else {
        return Err(Status::invalid_argument(format!(
            "target_path {}: not under {}",
            path.display(),
            root.display()
        )));
    };
    // A mount point is not a link (mount(2) resolved it), and a `stat` of one would wait on
    // its FUSE daemon, which may be starting or hung: it is never asked.
    let mounted = crate::mount_table::mount_points();
    let mut at = root.to_path_buf();
    for part in below.components() {
        at.push(part);
        if mounted.contains(&at) {
            continue;
        }
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Status::invalid_argument(format!(
                    "target_path {}: {} is a symbolic link (a target and the directories \
                     above it must be real directories)",
                    path.display(),
                    at.display()
                )));
            }
            Ok(_) => {}
            // Not made yet: nothing below it exists either.
            Err(_) => break,
        }
    }
    Ok(())
}

/// `statvfs` of `target` on another thread, for at most `limit` ([`ask_within`]): `None` when
/// it did not answer in time (a daemon still starting, or hung) or its previous `statvfs` has
/// not returned. A mount whose daemon is gone answers ENOTCONN or ECONNABORTED.
pub(super) fn statvfs_within(
    target: &Path,
    limit: Duration,
) -> Option<nix::Result<nix::sys::statvfs::Statvfs>> {
    static ASKING: Asking = std::sync::OnceLock::new();
    ask_within(&ASKING, target, limit, nix::sys::statvfs::statvfs)
}

/// The paths a caller of [`ask_within`] is asking about now.
pub(super) type Asking = std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<PathBuf>>>;

/// `ask(path)` on another thread, for at most `limit`: `None` when it did not return in time, or
/// when `path`'s previous ask (in `asking`) has not returned yet — then no thread is started, so
/// a FUSE daemon that hangs costs one blocked thread, however often it is asked about.
pub(super) fn ask_within<T: Send + 'static>(
    asking: &'static Asking,
    path: &Path,
    limit: Duration,
    ask: fn(&Path) -> T,
) -> Option<T> {
    let asking = asking.get_or_init(Default::default);
    if !asking
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(path.to_path_buf())
    {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let answer = ask(&p);
        asking.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
        let _ = tx.send(answer);
    });
    rx.recv_timeout(limit).ok()
}

/// Whether a mount that is not this volume's is left at `path` after its own were undone:
/// logged, and to be left as it is, with the directory under it.
pub(super) fn another_mount_left(path: &Path, volume_id: &str) -> bool {
    let Some(fstype) = crate::mount_table::mount_fstype(path) else {
        return false;
    };
    let source = crate::mount_table::mount_source(path).unwrap_or_default();
    log::warn!(
        "volume {volume_id}: {} holds another mount ({fstype} of {source}), left as it is",
        path.display()
    );
    true
}

/// Whether the mount on top at `target` is this volume's: `fuse.loosefs` with the source
/// `want` (`loosefs:csi/VOLUME`).
pub(super) fn is_ours(target: &Path, want: &str) -> bool {
    crate::mount_table::is_loosefs_mount_of(target, want)
}

/// Unmounts this volume's mounts at `target` (source `want`; lazily when busy), every layer of
/// it that is this volume's, and nothing else: a mount of another volume or file system on top
/// stays.
pub(super) fn unmount_ours(target: &Path, want: &str) -> Result<(), Status> {
    use nix::mount::{MntFlags, umount2};
    while is_ours(target, want) {
        match umount2(target, MntFlags::empty()) {
            Ok(()) => {}
            Err(nix::errno::Errno::EBUSY) => {
                umount2(target, MntFlags::MNT_DETACH).map_err(|e| {
                    Status::internal(format!("cannot detach {}: {e}", target.display()))
                })?
            }
            Err(nix::errno::Errno::EINVAL) => break,
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot unmount {}: {e}",
                    target.display()
                )));
            }
        }
    }
    Ok(())
}

/// Removes a directory tree, absent or not.
pub(super) fn remove_tree(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        log::warn!("cannot remove {}: {e}", dir.display());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::csi) fn config() -> NodeConfig {
        NodeConfig {
            driver_name: "csi.loosefs.dev".into(),
            node_id: "n1".into(),
            mounter: "/run/m.sock".into(),
            work_dir: "/var/lib/loosefs-csi".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            publish_timeout: Duration::from_secs(1),
            keep_after_unstage: Duration::from_secs(86400),
            cache_keep_free: 20,
            metrics_addr: None,
        }
    }

    #[test]
    fn targets_outside_the_kubelet_directory_are_refused() {
        let c = config();
        assert!(check_target(&c, "/var/lib/kubelet/pods/u/volumes/x/mount", "target_path").is_ok());
        for bad in [
            "",
            "relative",
            "/etc",
            "/var/lib/kubelet/../../etc",
            "/var/lib/kubeletx/a",
            "/var/lib/kubelet",
            "/var/lib/kubelet/",
        ] {
            let e = check_target(&c, bad, "target_path").unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn a_target_is_taken_in_canonical_form() {
        let c = config();
        for given in [
            "/var/lib/kubelet/pods/u/volumes/x/mount/",
            "/var/lib/kubelet//pods/u/./volumes/x//mount",
        ] {
            assert_eq!(
                check_target(&c, given, "target_path").unwrap(),
                PathBuf::from("/var/lib/kubelet/pods/u/volumes/x/mount"),
                "{given}"
            );
        }
    }

    #[test]
    fn a_target_that_is_or_lies_under_a_link_is_refused() {
        // reliability-probe.md, csi-target-symlink-escape.
        let d = tempfile::tempdir().unwrap();
        let kubelet = d.path().join("kubelet");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(kubelet.join("pods/a/volumes")).unwrap();
        std::fs::create_dir_all(kubelet.join("pods/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("pods/a/volumes/mount")).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("pods/b/volumes")).unwrap();
        let c = NodeConfig {
            kubelet_dir: kubelet.clone(),
            ..config()
        };
        for bad in ["pods/a/volumes/mount", "pods/b/volumes/x/mount"] {
            let e =
                check_target(&c, kubelet.join(bad).to_str().unwrap(), "target_path").unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(
                e.message().contains("symbolic link"),
                "{bad}: {}",
                e.message()
            );
        }
        assert!(
            check_target(
                &c,
                kubelet.join("pods/a/volumes/new/mount").to_str().unwrap(),
                "target_path"
            )
            .is_ok()
        );
        // The kubelet directory itself reached through a link: fine, and resolved.
        let link = d.path().join("kubelet-link");
        std::os::unix::fs::symlink(&kubelet, &link).unwrap();
        let c = NodeConfig {
            kubelet_dir: link,
            ..config()
        };
        let got = check_target(
            &c,
            d.path().join("kubelet-link/pods/a/m").to_str().unwrap(),
            "target_path",
        )
        .unwrap();
        assert_eq!(
            got,
            std::fs::canonicalize(&kubelet).unwrap().join("pods/a/m")
        );
    }

    #[test]
    fn a_path_still_being_asked_about_is_not_asked_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ASKED: AtomicUsize = AtomicUsize::new(0);
        static ASKING: Asking = std::sync::OnceLock::new();
        // Blocks while the file exists: a daemon that hangs.
        fn hang(p: &Path) -> bool {
            ASKED.fetch_add(1, Ordering::SeqCst);
            while p.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            true
        }
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("hung");
        std::fs::write(&f, b"").unwrap();
        let short = Duration::from_millis(50);
        assert_eq!(ask_within(&ASKING, &f, short, hang), None);
        assert_eq!(ask_within(&ASKING, &f, short, hang), None);
        assert_eq!(
            ASKED.load(Ordering::SeqCst),
            1,
            "a second thread was started"
        );
        std::fs::remove_file(&f).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if ask_within(&ASKING, &f, Duration::from_secs(5), hang) == Some(true) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never answered again");
        }
    }

    #[test]
    fn a_volume_names_its_mount_without_separators() {
        assert_eq!(mount_source("pv a,b"), "loosefs:csi/pv_a_b");
    }
}
