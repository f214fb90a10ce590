//! A volume's loosefs options, from a PersistentVolume's `spec.mountOptions` (which the kubelet
//! passes as `volume_capability.mount.mount_flags`) and its `mountOptions` volume attribute (a
//! comma-separated list, appended after them), as `loosefs mount` arguments.
//!
//! Each option is `name`, `name=value` or `name value`, with or without the leading `--`
//! (`decode=npy`, `warm`, `pin=8G`), the way mountpoint-s3's driver reads them. `ro` and `rw`
//! are dropped (a loosefs volume is always mounted read-only). Options that would reach the
//! node's files or processes outside the volume are refused: the mounter chooses the log, the
//! caches and the mount's permissions itself.

/// Options a volume may not set, with why: they belong to the driver.
const REFUSED: &[(&str, &str)] = &[
    (
        "foreground",
        "the mounter runs every daemon in the foreground",
    ),
    ("f", "the mounter runs every daemon in the foreground"),
    (
        "log",
        "the mounter keeps the daemon's log in the volume's directory",
    ),
    (
        "cache-dir",
        "the mounter keeps the caches in the volume's directory",
    ),
    (
        "index-dir",
        "the mounter keeps the caches in the volume's directory",
    ),
    ("allow-other", "the driver sets who may read the mount"),
    (
        "env-file",
        "the mounter gives the daemon its environment (a volume's secrets)",
    ),
    (
        "allow-non-empty",
        "the driver mounts on the target the kubelet gives",
    ),
    (
        "metrics-addr",
        "a daemon in the mounter's network namespace would listen on the node",
    ),
    ("help", "not an option"),
    ("version", "not an option"),
];

/// The `loosefs mount` arguments (`--name` or `--name=value`, one word each) for `flags` (the PV's
/// `mountOptions`) followed by `attribute` (the `mountOptions` volume attribute), checked by
/// the same parser as `loosefs mount`.
///
/// Errors (the message names the option and what is wrong): an option the driver sets itself,
/// an option `loosefs mount` does not have, or a value it refuses.
pub fn mount_args(flags: &[String], attribute: Option<&str>) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let from_attribute = attribute
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(str::to_string);
    for flag in flags.iter().cloned().chain(from_attribute) {
        let flag = flag.trim();
        if flag.is_empty() || flag == "ro" || flag == "rw" {
            continue;
        }
        let bare = flag.trim_start_matches('-');
        let (name, value) = match bare.split_once(['=', ' ']) {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (bare, None),
        };
        if let Some((_, why)) = REFUSED.iter().find(|(n, _)| *n == name) {
            return Err(format!("mount option {flag:?}: not allowed here ({why})"));
        }
        // One word, `--name=value`: a value is never read as an option of its own
        // (`warm=--metrics-addr=…` must not become `--warm --metrics-addr=…`).
        args.push(match value {
            Some(v) => format!("--{name}={v}"),
            None => format!("--{name}"),
        });
    }
    crate::options::parse::check_mount_args(&args)?;
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn every_spelling_becomes_a_long_option() {
        let got = mount_args(
            &s(&["decode=npy", "--warm", "pin 1G", "ro"]),
            Some("threads=4"),
        )
        .unwrap();
        assert_eq!(
            got,
            s(&["--decode=npy", "--warm", "--pin=1G", "--threads=4"])
        );
        assert_eq!(mount_args(&[], None).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn unknown_options_and_bad_values_are_named() {
        let e = mount_args(&s(&["wram"]), None).unwrap_err();
        assert!(e.contains("--wram"), "{e}");
        let e = mount_args(&s(&["threads=many"]), None).unwrap_err();
        assert!(e.contains("many"), "{e}");
    }

    #[test]
    fn options_the_driver_owns_are_refused() {
        for bad in [
            "log=/etc/x",
            "--cache-dir=/",
            "allow-other",
            "metrics-addr=:9",
            "f",
        ] {
            let e = mount_args(&s(&[bad]), None).unwrap_err();
            assert!(e.contains("not allowed here"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_value_that_looks_like_an_option_stays_a_value() {
        // reliability-probe.md, csi-option-smuggling: the refused options smuggled in values.
        for bad in [
            "warm=--metrics-addr=127.0.0.1:9",
            "warm=--allow-non-empty",
            "warm --allow-other",
            "label=--metrics-addr=127.0.0.1:9 --warm",
        ] {
            match mount_args(&s(&[bad]), None) {
                Err(_) => {}
                Ok(args) => assert!(
                    args.iter()
                        .all(|a| !a.starts_with("--metrics-addr") && !a.starts_with("--allow-")),
                    "{bad}: {args:?}"
                ),
            }
        }
        let e = mount_args(&[], Some("warm=--metrics-addr=127.0.0.1:9")).unwrap_err();
        assert!(e.contains("--metrics-addr"), "{e}");
    }
}
