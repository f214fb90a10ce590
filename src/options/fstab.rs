//! mount(8)'s way of giving options, translated into `loosefs mount` flags: `-o LIST` on the
//! command line, and the binary called as a mount helper (`mount -t fuse.loosefs`, an fstab
//! line, systemd's mount units). docs/CONFIGURATION.md, "mount(8), fstab and systemd".

use anyhow::Result;

/// Names under which the binary acts as a mount(8) helper (`mount -t fuse.loosefs`, fstab).
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.loosefs", "mount.loosefs"];

/// mount(8) and FUSE options that need nothing from loosefs: it always mounts read-only,
/// `nosuid`, `nodev`, `noatime`, with `default_permissions`.
const IGNORED_OPTIONS: [&str; 22] = [
    "ro",
    "rw",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "noatime",
    "relatime",
    "strictatime",
    "nosuid",
    "nodev",
    "noexec",
    "exec",
    "async",
    "sync",
    "default_permissions",
];

/// The `loosefs mount` flags of a mount(8) `-o` list (`ro,warm,pin=8G,allow_other`): each
/// option `k[=v]` becomes `--k [v]` (`_` as `-`; `decode=npy+ppm` as `--decode npy,ppm`);
/// mount(8)'s generic options are left out ([`IGNORED_OPTIONS`], `x-*`, `comment`, `fsname`,
/// `subtype`).
pub fn o_flags(list: &str) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    for o in list.split(',') {
        let (k, v) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        if o.is_empty()
            || IGNORED_OPTIONS.contains(&k)
            || k.starts_with("x-")
            || k == "comment"
            || k == "fsname"
            || k == "subtype"
        {
            continue;
        }
        out.push(format!("--{}", k.replace('_', "-")).into());
        if let Some(v) = v {
            let v = if k == "decode" {
                v.replace(['+', ':'], ",")
            } else {
                v.into()
            };
            out.push(v.into());
        }
    }
    out
}

/// `loosefs mount … -o LIST …` as mount(8) users type it: every `-o LIST` (or `-oLIST`)
/// before a `--` replaced by its flags ([`o_flags`]); `None` when there is none (or the
/// command is not `mount`).
pub fn expand_mount_o(args: &[std::ffi::OsString]) -> Option<Vec<std::ffi::OsString>> {
    if args.get(1).and_then(|a| a.to_str()) != Some("mount") {
        return None;
    }
    let mut out = Vec::with_capacity(args.len());
    let mut changed = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--") => {
                out.push(a.clone());
                out.extend(it.by_ref().cloned());
            }
            Some("-o") => {
                changed = true;
                if let Some(list) = it.next() {
                    out.extend(o_flags(&list.to_string_lossy()));
                }
            }
            Some(x) if x.starts_with("-o") && x.len() > 2 => {
                changed = true;
                out.extend(o_flags(&x[2..]));
            }
            _ => out.push(a.clone()),
        }
    }
    changed.then_some(out)
}

/// Turns a mount(8) helper invocation, `mount.fuse.loosefs PACK DIR [-sfnv] [-N NS] [-o OPTS]
/// [-t TYPE]`, into the equivalent `loosefs mount PACK DIR --option value …` command line.
/// `-o` options are the long options of `loosefs mount` with `_` or `-` (`warm`,
/// `pin=8G`, `decode=npy+ppm` for `--decode npy,ppm`, `allow_other`, `log=/var/log/x`),
/// plus mount(8)'s generic ones, which are accepted and ignored (`ro`, `rw`, `nofail`,
/// `x-systemd.*`, `comment=…`; loosefs is always read-only). Errors: a missing PACK or DIR.
pub fn helper_args(args: &[std::ffi::OsString]) -> Result<Vec<std::ffi::OsString>> {
    use std::ffi::OsString;
    let mut out: Vec<OsString> = vec!["loosefs".into(), "mount".into()];
    let mut positional = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                if let Some(o) = it.next() {
                    out.extend(o_flags(&o.to_string_lossy()));
                }
            }
            Some("-t" | "-N") => {
                it.next();
            }
            Some(f) if f.starts_with('-') && f.len() > 1 => {} // -s -f -n -v -r: nothing to do
            _ => positional.push(a.clone()),
        }
    }
    let [pack, dir] = <[OsString; 2]>::try_from(positional).map_err(|p| {
        anyhow::anyhow!(
            "usage: mount.fuse.loosefs PACK MOUNTPOINT [-o OPTIONS] (got {} paths)",
            p.len()
        )
    })?;
    out.splice(2..2, [pack, dir]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_helper_options_become_flags() {
        let args: Vec<std::ffi::OsString> = [
            "/sbin/mount.fuse.loosefs",
            "/d/train.pack",
            "/mnt/train",
            "-o",
            "rw,nofail,x-systemd.automount,warm,pin=8G,decode=npy+ppm,allow_other,prefetch_max_mb=16",
            "-n",
        ]
        .iter()
        .map(Into::into)
        .collect();
        let got: Vec<String> = helper_args(&args)
            .unwrap()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            got,
            [
                "loosefs",
                "mount",
                "/d/train.pack",
                "/mnt/train",
                "--warm",
                "--pin",
                "8G",
                "--decode",
                "npy,ppm",
                "--allow-other",
                "--prefetch-max-mb",
                "16"
            ]
        );
        assert!(helper_args(&args[..2]).is_err());
    }

    #[test]
    fn mount_dash_o_on_the_command_line_becomes_flags() {
        let v = |a: &[&str]| -> Vec<std::ffi::OsString> { a.iter().map(Into::into).collect() };
        let got = expand_mount_o(&v(&[
            "loosefs",
            "mount",
            "p.pack",
            "/m",
            "-o",
            "ro,allow_other,pin=1G",
            "--warm",
            "-odecode=npy",
        ]))
        .unwrap();
        let want = v(&[
            "loosefs",
            "mount",
            "p.pack",
            "/m",
            "--allow-other",
            "--pin",
            "1G",
            "--warm",
            "--decode",
            "npy",
        ]);
        assert_eq!(got, want);
        // Nothing to do without -o, for other commands, and after `--`.
        assert!(expand_mount_o(&v(&["loosefs", "mount", "p", "/m", "--warm"])).is_none());
        assert!(expand_mount_o(&v(&["loosefs", "info", "p", "-o", "x"])).is_none());
        assert!(expand_mount_o(&v(&["loosefs", "mount", "p", "/m", "--", "-o"])).is_none());
    }
}
