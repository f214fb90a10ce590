//! The `loosefs` executable: parses the command line (its grammar is
//! `loosefs::options::cli`), runs each command (the bodies below call the library), and sets
//! up the process (panic hook, logging, the one-line error and its exit code).

use anyhow::{Context, Result};
use clap::Parser;
use loosefs::options::cli::{Cli, Cmd, PackCmd, StatsFormat};
use loosefs::pack::reader::Pack;
use loosefs::progress::Progress;

/// Writes a line to the standard output. A reader that went away (`| head`) ends nothing: the
/// line is dropped. Errors: any other write failure (a full disk), with what failed.
fn write_out(line: std::fmt::Arguments) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to the standard output")
        }
        _ => Ok(()),
    }
}

/// `println!` through [`write_out`]: `outln!(...)?`.
macro_rules! outln {
    ($($t:tt)*) => {
        write_out(format_args!($($t)*))
    };
}

fn open(pack: &std::path::Path) -> Result<Pack> {
    Pack::open(pack).with_context(|| format!("cannot open pack {}", pack.display()))
}

/// `loosefs pack`: packs `src` (to a URL: into a staging file in the cache, then uploaded).
fn cmd_pack(args: PackCmd) -> Result<()> {
    let PackCmd {
        src,
        out,
        jobs,
        align,
        follow_links,
        force,
        json,
        progress_lines,
        source,
    } = args;
    let url = out
        .to_str()
        .filter(|s| loosefs::storage::object::is_url(s))
        .map(str::to_string);
    // A URL: packed into a temp file in the cache directory, then uploaded.
    let staging = match &url {
        Some(_) => {
            let root = source
                .remote
                .cache_dir
                .clone()
                .unwrap_or_else(loosefs::storage::block_cache::default_root);
            std::fs::create_dir_all(&root)?;
            Some(
                tempfile::Builder::new()
                    .suffix(".pack")
                    .tempfile_in(&root)?,
            )
        }
        None => None,
    };
    let out = staging.as_ref().map_or(out, |t| t.path().to_path_buf());
    let remote = source.remote.clone();
    let opts = loosefs::packer::PackOptions {
        jobs,
        align,
        follow_links,
        force: force || url.is_some(),
        progress: Progress::from_flags(progress_lines, json),
        source: source.open_options(),
    };
    let r = loosefs::packer::pack_dir(&src, &out, &opts)?;
    if let Some(url) = &url {
        loosefs::storage::object::connect(remote.config()).upload(url, &out)?;
        if !json {
            loosefs::eprintln_lossy!("uploaded {} bytes to {url}", r.pack_bytes);
        }
    }
    let out = url.map_or(out, std::path::PathBuf::from);
    if json {
        outln!("{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        for (p, why) in &r.skipped {
            loosefs::eprintln_lossy!("skipped {}: {why}", p.display());
        }
        outln!(
            "packed {} files ({} JPEG) and {} directories, {:.1} MB, into {} ({:.1} MB) in {:.2} s ({:.0} files/s, {:.0} MB/s)",
            r.files,
            r.jpegs,
            r.dirs,
            r.bytes as f64 / 1e6,
            out.display(),
            r.pack_bytes as f64 / 1e6,
            r.seconds,
            r.files as f64 / r.seconds,
            r.bytes as f64 / 1e6 / r.seconds
        )?;
    }
    if align > 1 && r.bytes > 0 && r.pack_bytes > 2 * r.bytes {
        // Many files far smaller than the alignment: padding, headers and the index dominate.
        loosefs::eprintln_lossy!(
            "loosefs: warning: the pack is {:.1}x its files' bytes ({} files of {:.0} bytes on \
             average, each aligned to {align} bytes, with its zip headers and index entry); \
             `--align 1` leaves out the padding",
            r.pack_bytes as f64 / r.bytes as f64,
            r.files,
            r.bytes as f64 / r.files.max(1) as f64,
        );
    }
    Ok(())
}

/// `loosefs index`: the dataset indexed (or its local index reused) and written as a shared
/// index.
fn cmd_index(
    src: &std::path::Path,
    out: Option<&std::path::Path>,
    args: &loosefs::options::SourceArgs,
    progress: Progress,
) -> Result<()> {
    use loosefs::formats::index::shared;
    if let Some(url) = src.to_str().filter(|s| loosefs::storage::object::is_url(s)) {
        outln!(
            "{}",
            loosefs::open::index_url(
                url,
                out,
                &args.open_options(),
                loosefs::storage::object::connect(args.remote.config()),
                progress,
            )?
        )?;
        return Ok(());
    }
    let opts = loosefs::formats::ScanOptions {
        shared_index: loosefs::formats::SharedIndex::Off,
        ..args.open_options().scan_options()?
    };
    let f = loosefs::formats::index::open(src, &opts, args.index_dir.as_deref(), progress)?;
    let src = &f.header.source;
    let dest = out.map_or_else(|| shared::default_path(src), std::path::Path::to_path_buf);
    shared::write(&f, src, &dest)?;
    let i = f.info();
    outln!(
        "{}: shared index of {} ({}, {} samples in {} files, verify {}); mounts of it use it while every file keeps its size and mtime",
        dest.display(),
        src.display(),
        i.format,
        i.samples,
        i.files,
        i.verify
    )?;
    Ok(())
}

/// `loosefs info`: a pack's, a remote pack's or a foreign dataset's summary.
fn cmd_info(
    pack: &std::path::Path,
    json: bool,
    source: &loosefs::options::SourceArgs,
) -> Result<()> {
    let source = source.open_options().for_info(pack);
    let progress = Progress::from_flags(false, json);
    let d = loosefs::open::Dataset::open(pack, &source, progress)?.info()?;
    match json {
        true => outln!("{}", d.json)?,
        false => print!("{}", d.text),
    }
    Ok(())
}

/// `loosefs verify`: every sample's CRC-32, and every byte against `against`; exit code 1
/// when something does not match.
fn cmd_verify(
    pack: &std::path::Path,
    against: Option<&std::path::Path>,
    remote: &loosefs::options::RemoteArgs,
) -> Result<i32> {
    // A URL: every block is downloaded into the cache, which is then the whole pack.
    let p = match pack
        .to_str()
        .filter(|s| loosefs::storage::object::is_url(s))
    {
        Some(url) => {
            let store = loosefs::storage::object::connect(remote.config());
            let mut r =
                loosefs::open::remote_pack::RemotePack::open(url, &*store, &remote.config())
                    .with_context(|| format!("cannot open {url}"))?;
            r.finish();
            open(&r.download()?)?
        }
        // `verify` takes a pack: a directory is the wrong thing to give it, not a damaged pack.
        None => open(pack).map_err(|e| match pack.is_dir() {
            true => loosefs::exit_code::with_kind(e, loosefs::exit_code::ExitKind::Usage),
            false => e,
        })?,
    };
    let problems = loosefs::verify::verify(&p, against)?;
    for line in &problems {
        outln!("MISMATCH {line}")?;
    }
    if !problems.is_empty() {
        loosefs::eprintln_lossy!("{}: {} problem(s)", pack.display(), problems.len());
        return Ok(1);
    }
    outln!(
        "{}: {} samples OK{}",
        pack.display(),
        p.totals().files,
        if against.is_some() {
            ", identical to the source"
        } else {
            ""
        }
    )?;
    Ok(0)
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Pack(args) => cmd_pack(args)?,
        Cmd::Mount {
            pack,
            mountpoint,
            opts,
        } => loosefs::mount::mount(&pack, &mountpoint, &opts.daemon_options()?)?,
        Cmd::Stats {
            mountpoint,
            format,
            json,
            prometheus,
        } => {
            let v: loosefs::report::Report = loosefs::client::read_control(&mountpoint, "stats")?;
            let format = match (json, prometheus) {
                (true, _) => StatsFormat::Json,
                (_, true) => StatsFormat::Prometheus,
                _ => format,
            };
            if matches!(format, StatsFormat::Prometheus | StatsFormat::Openmetrics) {
                let mnt = std::fs::canonicalize(&mountpoint).unwrap_or(mountpoint.clone());
                let mnt = mnt.to_string_lossy();
                if format == StatsFormat::Prometheus {
                    print!("{}", loosefs::metrics::prometheus(&v, &mnt));
                } else {
                    print!("{}", loosefs::metrics::openmetrics(&v, &mnt));
                }
            } else if format == StatsFormat::Json {
                outln!("{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                print!("{}", loosefs::client::format_stats(&v));
            }
        }
        Cmd::Warm { mountpoint, wait } => {
            let v: loosefs::report::WarmCommandReport =
                loosefs::client::read_control(&mountpoint, "warm")?;
            if !wait {
                outln!("{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                loosefs::client::wait_warm(&mountpoint)?;
            }
        }
        Cmd::DropCache { mountpoint, json } => {
            let v: loosefs::report::DropCacheReport =
                loosefs::client::read_control(&mountpoint, "drop-cache")?;
            match json {
                true => outln!("{}", serde_json::to_string_pretty(&v)?)?,
                false => print!("{}", loosefs::client::format_drop_cache(&v)),
            }
        }
        Cmd::Umount { mountpoint, lazy } => loosefs::mount::unmount_and_wait(&mountpoint, lazy)?,
        Cmd::Restart { mountpoint } => {
            let r = loosefs::mount::keeper::restart(&mountpoint)?;
            let restarts = r.daemon.keeper.map_or(0, |k| k.restarts);
            outln!(
                "restarted {}: daemon pid {}, loosefs {} ({restarts} restarts so far)",
                mountpoint.display(),
                r.daemon.pid,
                r.daemon.version
            )?;
        }
        Cmd::Keep {
            offer,
            resend,
            daemon,
            catalog,
            mountpoint,
            log,
            command,
        } => {
            let offer = loosefs::fuse::takeover::InitOffer::parse(&offer)?;
            let catalog = u32::from_str_radix(&catalog, 16)
                .map_err(|_| anyhow::anyhow!("--catalog {catalog:?} is not a fingerprint"))?;
            return loosefs::mount::keeper::keep(loosefs::mount::keeper::KeepArgs {
                fd: loosefs::mount::keeper::KEPT_FD,
                offer,
                resend,
                daemon: Some(daemon),
                catalog,
                mountpoint,
                log,
                command,
            });
        }
        Cmd::Info { pack, json, source } => cmd_info(&pack, json, &source)?,
        Cmd::FuseFd {
            mountpoint,
            allow_other,
            owner,
            fd,
            read_ahead_kb,
            send,
            receive,
            command,
        } => {
            use loosefs::mount::handover;
            if let Some(socket) = receive {
                return handover::receive(&socket, fd, &command);
            }
            let to = match send {
                Some(socket) => handover::Handover::Send(socket),
                None => handover::Handover::Run { fd, command },
            };
            let mnt = mountpoint.expect("clap requires it without --receive");
            return handover::fuse_fd(&mnt, allow_other, owner.as_deref(), read_ahead_kb, &to);
        }
        Cmd::Csi {
            endpoint,
            node_id,
            driver_name,
            mounter,
            work_dir,
            kubelet_dir,
            publish_timeout,
            keep_after_unstage,
            cache_keep_free,
            metrics_addr,
        } => {
            let socket = loosefs::csi::endpoint_path(&endpoint)?;
            loosefs::csi::serve(
                &socket,
                loosefs::csi::NodeConfig {
                    driver_name,
                    node_id,
                    mounter,
                    work_dir,
                    kubelet_dir,
                    publish_timeout: std::time::Duration::from_secs(publish_timeout),
                    keep_after_unstage: std::time::Duration::from_secs(keep_after_unstage),
                    cache_keep_free,
                    metrics_addr,
                },
            )?
        }
        Cmd::CsiMounter { socket, check } => {
            if check {
                return match loosefs::csi::mounter::ping(&socket) {
                    Ok(()) => Ok(0),
                    Err(e) => {
                        loosefs::eprintln_lossy!("loosefs csi-mounter --check: {e:#}");
                        Ok(1)
                    }
                };
            }
            loosefs::csi::mounter::run(&socket)?
        }
        Cmd::Index {
            source,
            out,
            progress_lines,
            args,
        } => cmd_index(
            &source,
            out.as_deref(),
            &args,
            Progress::from_flags(progress_lines, false),
        )?,
        Cmd::Verify {
            pack,
            against,
            remote,
        } => return cmd_verify(&pack, against.as_deref(), &remote),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "loosefs", &mut std::io::stdout());
        }
        Cmd::Man => {
            use clap::CommandFactory;
            man_page(&Cli::command(), &mut std::io::stdout())?;
        }
    }
    Ok(0)
}

/// Reports a panic in one line: where and what. Whoever catches it (a scan, a chunk decode, a
/// FUSE request) names the file and answers with an error; a backtrace is printed only when
/// `LOOSEFS_BACKTRACE=1` (a bug report), not for every damaged input.
fn panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = loosefs::stats::panic_message(info.payload());
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        loosefs::eprintln_lossy!("loosefs: internal error at {at}: {msg}");
        if std::env::var_os("LOOSEFS_BACKTRACE").is_some_and(|v| v == "1") {
            loosefs::eprintln_lossy!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
}

/// Writes the manual page of `cmd` and a section per subcommand (roff, `man 1 loosefs`).
fn man_page(cmd: &clap::Command, out: &mut dyn std::io::Write) -> Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name();
        writeln!(out, ".SH \"LOOSEFS {}\"", name.to_uppercase())?;
        let sub_man = clap_mangen::Man::new(sub.clone().bin_name(format!("loosefs {name}")));
        sub_man.render_synopsis_section(out)?;
        sub_man.render_description_section(out)?;
        sub_man.render_options_section(out)?;
    }
    man.render_version_section(out)?;
    Ok(())
}

/// Warnings and errors by default; RUST_LOG overrides; `mount --debug` adds loosefs's own
/// debug messages. fuser warns when the mount it tracks was already unmounted by us or by
/// `umount`: noise, left out.
fn init_logging(debug: bool) {
    let mut b = env_logger::Builder::new();
    b.filter_level(log::LevelFilter::Warn)
        .filter_module("fuser::mnt", log::LevelFilter::Error)
        .parse_env("RUST_LOG");
    if debug {
        b.filter_module("loosefs", log::LevelFilter::Debug);
    }
    // The daemon's log file, once it has one, rotated by size while it runs.
    b.target(env_logger::Target::Pipe(Box::new(loosefs::mount::LogSink)));
    b.init();
}

/// An error and its causes in one line, each subject said once: a cause that repeats what the
/// message before it is about (`cannot mount URL` then `cannot open URL`, or `URL: …` after a
/// message ending in URL) keeps only what it adds.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut subject: Option<String> = None;
    for cause in e.chain() {
        let mut text = cause.to_string();
        if let Some(s) = &subject {
            // `cannot VERB SUBJECT` (and `: rest`) about the same subject: only the rest.
            if let Some(rest) = text.strip_prefix("cannot ").and_then(|t| {
                let (_, after_verb) = t.split_once(' ')?;
                let object = after_verb.strip_prefix("source ").unwrap_or(after_verb);
                object
                    .strip_prefix(s.as_str())
                    .filter(|r| r.is_empty() || r.starts_with(':'))
            }) {
                text = rest.trim_start_matches(':').trim_start().to_string();
            } else if let Some(rest) = text.strip_prefix(&format!("{s}: ")) {
                text = rest.to_string();
            }
        }
        if text.is_empty() {
            continue;
        }
        subject = text
            .strip_prefix("cannot ")
            .and_then(|t| t.split_once(' '))
            .map(|(_, s)| s.split(": ").next().unwrap_or(s).to_string())
            .or(subject);
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Parses the command line, exiting as clap does on an error; a value refused that came from a
/// `LOOSEFS_*` variable rather than the command line is reported naming that variable, in one
/// line.
fn parse_cli(args: Vec<std::ffi::OsString>) -> Cli {
    use clap::CommandFactory;
    match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(msg) = loosefs::options::parse::env_error(&e, &Cli::command(), &args) {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "loosefs: error: {msg}");
                std::process::exit(2);
            }
            e.exit()
        }
    }
}

/// `args` with an Azure URL's shared access signature taken out of it and put in
/// `$AZURE_STORAGE_SAS_TOKEN` (where the client reads it), and whether one was: the daemon and
/// its keeper are then given the result (`set_command_line`), so no process started from this
/// one, log, stats or mount table holds it.
fn sas_out_of_args(args: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, bool) {
    let mut sas = None;
    let out: Vec<std::ffi::OsString> = args
        .into_iter()
        .map(|a| {
            match a
                .to_str()
                .and_then(loosefs::storage::object::sas_out_of_url)
            {
                Some((bare, token)) => {
                    sas = Some(token);
                    bare.into()
                }
                None => a,
            }
        })
        .collect();
    let taken = sas.is_some();
    if let Some(token) = sas {
        // SAFETY: called first thing in `main`, before any thread is started (no other thread
        // can read the environment while it changes).
        unsafe { std::env::set_var("AZURE_STORAGE_SAS_TOKEN", token) };
    }
    (out, taken)
}

fn main() {
    panic_hook();
    // Called by mount(8) as a helper (`mount -t fuse.loosefs`, an fstab line): the options
    // come as `-o a,b=c` and become `loosefs mount` flags.
    let (args, sas_taken) = sas_out_of_args(std::env::args_os().collect());
    let argv0 = args
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name());
    let args = if argv0.is_some_and(|n| {
        loosefs::options::fstab::HELPER_NAMES
            .iter()
            .any(|h| n == *h)
    }) {
        match loosefs::options::fstab::helper_args(&args) {
            Ok(a) => {
                loosefs::mount::set_command_line(a.clone());
                a
            }
            Err(e) => {
                loosefs::eprintln_lossy!("loosefs: error: {e:#}");
                std::process::exit(2);
            }
        }
    } else if let Some(a) = loosefs::options::fstab::expand_mount_o(&args) {
        // `loosefs mount SRC MNT -o ro,warm`: mount(8)'s way of giving options.
        loosefs::mount::set_command_line(a.clone());
        a
    } else {
        if sas_taken {
            loosefs::mount::set_command_line(args.clone());
        }
        args
    };
    let mut cli = parse_cli(args.clone());
    if let Cmd::Mount { opts, .. } = &cli.cmd
        && let Some(f) = &opts.env_file
    {
        match loosefs::mount::env_file::read(f) {
            Ok(vars) => {
                // A variable already in the environment is kept (as the user's own says).
                let new: Vec<_> = vars
                    .into_iter()
                    .filter(|(k, _)| std::env::var_os(k).is_none())
                    .collect();
                let options = new.iter().any(|(k, _)| k.starts_with("LOOSEFS_"));
                for (k, v) in new {
                    // SAFETY: still before any thread is started (nothing has run but the
                    // parsing of the command line), so no thread reads the environment.
                    unsafe { std::env::set_var(k, v) };
                }
                if options {
                    // The file's LOOSEFS_* options, read as the command line's defaults.
                    cli = parse_cli(args);
                }
            }
            Err(e) => {
                loosefs::eprintln_lossy!("loosefs: error: {e:#}");
                std::process::exit(2);
            }
        }
    }
    init_logging(matches!(&cli.cmd, Cmd::Mount { opts, .. } if opts.debug));
    match run(cli) {
        Ok(code) => std::process::exit(code),
        // The daemon said why already, on the same stderr.
        Err(e) if e.downcast_ref::<loosefs::mount::DaemonFailed>().is_some() => {
            let code = e
                .downcast_ref::<loosefs::mount::DaemonFailed>()
                .map_or(2, |d| d.0);
            std::process::exit(code)
        }
        Err(e) => {
            loosefs::eprintln_lossy!("loosefs: error: {}", one_line(&e));
            std::process::exit(loosefs::exit_code::ExitKind::of(&e).code());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_says_each_subject_once() {
        let url = "https://127.0.0.1:9/data.pack";
        let e = anyhow::anyhow!("nothing listens at 127.0.0.1:9 (connection refused)")
            .context(format!("{url}: cannot reach the server"))
            .context(format!("cannot open {url}"))
            .context(format!("cannot mount {url}"));
        assert_eq!(
            one_line(&e),
            format!(
                "cannot mount {url}: cannot reach the server: nothing listens at 127.0.0.1:9 (connection refused)"
            )
        );
        // `cannot open source X` after `cannot index X`, and a cause that only repeats the
        // subject, add only what is new.
        let e = anyhow::anyhow!("/d/x.tar: truncated member")
            .context("cannot open source /d/x.tar")
            .context("cannot index /d/x.tar");
        assert_eq!(one_line(&e), "cannot index /d/x.tar: truncated member");
        // Different subjects are kept, in order, on one line.
        let e = anyhow::anyhow!("Permission denied (os error 13)")
            .context("cannot open log /var/log/x");
        let line = one_line(&e);
        assert_eq!(
            line,
            "cannot open log /var/log/x: Permission denied (os error 13)"
        );
        assert!(!line.contains('\n'));
    }
}
