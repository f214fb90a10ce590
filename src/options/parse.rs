//! The command line checked apart from its parse in `main`: a value refused that came from a
//! `LOOSEFS_*` variable named as such ([`env_error`]), and `loosefs mount`'s options checked by
//! its own parser for a caller that passes them to a daemon it starts ([`check_mount_args`]:
//! the CSI driver's volume options).

use super::MountArgs;

/// The arguments of `loosefs mount SOURCE MOUNTPOINT`, as the command parses them.
#[derive(clap::Parser)]
#[command(name = "loosefs mount", no_binary_name = true)]
struct MountCommand {
    source: String,
    mountpoint: String,
    #[command(flatten)]
    opts: MountArgs,
}

/// The one-line message for `e`, clap's error for `args` parsed by `cmd`, when the value it
/// refuses came from an option's `LOOSEFS_*` variable and not from the command line: it names
/// the variable and its value (`invalid value 'abc' for LOOSEFS_THREADS (the variable of
/// --threads): …`), where clap would name a flag the user never typed. `None` for any other
/// error.
pub fn env_error(
    e: &clap::Error,
    cmd: &clap::Command,
    args: &[std::ffi::OsString],
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let ContextValue::String(shown) = e.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let long = shown.split([' ', '=', '[']).next()?.strip_prefix("--")?;
    // The subcommand's own argument of that name (the first word that names a subcommand).
    let sub = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find_map(|a| cmd.find_subcommand(a))?;
    let arg = sub.get_arguments().find(|a| a.get_long() == Some(long))?;
    let var = arg.get_env()?;
    let value = std::env::var_os(var)?;
    let typed = args.iter().filter_map(|a| a.to_str()).any(|a| {
        a == format!("--{long}")
            || a.starts_with(&format!("--{long}="))
            || arg
                .get_short()
                .is_some_and(|s| a.starts_with('-') && !a.starts_with("--") && a.contains(s))
    });
    if typed {
        return None;
    }
    let var = var.to_string_lossy();
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let named = format!(
        "{var} (the variable of --{long}, set to {:?})",
        value.to_string_lossy()
    );
    Some(first.replace(&format!("'{shown}'"), &named))
}

/// Checks `args` (options only: `--decode`, `npy`, `--warm`, …) as `loosefs mount` parses
/// them, for a caller that passes them on to a daemon (the CSI driver's volume options).
/// Errors: the parser's first line, without its `error: ` (names the option and the problem).
pub fn check_mount_args(args: &[String]) -> Result<(), String> {
    use clap::Parser;
    let argv = ["SOURCE".to_string(), "/dev/fd/3".to_string()]
        .into_iter()
        .chain(args.iter().cloned());
    MountCommand::try_parse_from(argv).map(|_| ()).map_err(|e| {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or("").trim();
        format!(
            "mount options: {}",
            first.strip_prefix("error: ").unwrap_or(first)
        )
    })
}
