//! How long steps show their progress: packing, scanning and indexing a dataset, walking a
//! directory tree, downloading objects to index them, pinning and warming a mount.
//!
//! One [`Progress`] mode per command: indicatif bars with their rate and ETA on a terminal
//! (nothing when stderr is not one), JSON lines for a program that wraps the command (the
//! Python package's tqdm bars, `--progress-lines`), or nothing (`--json`). Each step is a
//! [`Meter`]; a step whose length is not known yet (a walk, a scan) is a spinner that counts.
//!
//! A JSON line is one object on stderr, at most five a second per step plus one when the
//! step ends:
//!
//! ```text
//! {"progress": {"step": "index", "unit": "samples", "done": 24, "total": 48}}
//! {"progress": {"step": "walk", "unit": "files", "done": 51200, "total": null}}
//! {"note": "indexing /data/shards (WebDataset) once; the index is kept in ~/.cache/loosefs/index"}
//! ```
//!
//! `total` is `null` while unknown; a step's last line has `"end": true`. `pack` adds
//! `"files"` (files written). Notes are the sentences a terminal shows as `loosefs: …`.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a command shows the progress of its long steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing (`--json`, or a daemon whose stderr is its log).
    None,
    /// indicatif bars and spinners on stderr, drawn only when stderr is a terminal, and
    /// notes as `loosefs: …` lines.
    Bar,
    /// JSON lines on stderr (the module note), for a wrapping program.
    Lines,
}

/// What a step counts; bytes are drawn with their rate in MiB/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (pack, pin, warm, download).
    Bytes,
    /// Samples of a dataset (indexing).
    Samples,
    /// Files of a tree (a walk, a JPEG header probe).
    Files,
    /// Objects listed under a URL.
    Objects,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Samples => "samples",
            Unit::Files => "files",
            Unit::Objects => "objects",
        }
    }
}

/// Writes `line` to stderr, ignoring a reader that went away (a daemon whose `loosefs mount`
/// was interrupted: `eprintln!` would panic on the broken pipe).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The shortest time between two JSON lines of one step.
const LINE_EVERY: Duration = Duration::from_millis(200);

impl Progress {
    /// `Lines` if `lines`, else `None` if `quiet`, else `Bar`: the mode of a command with
    /// `--progress-lines` and `--json` flags.
    pub fn from_flags(lines: bool, quiet: bool) -> Progress {
        match (lines, quiet) {
            (true, _) => Progress::Lines,
            (false, true) => Progress::None,
            (false, false) => Progress::Bar,
        }
    }

    /// Says `what` once: `loosefs: what` on stderr with bars (terminal or not, as any message),
    /// a `{"note": what}` line with lines, nothing with `None`.
    pub fn note(self, what: &str) {
        match self {
            Progress::None => {}
            Progress::Bar => say(&format!("loosefs: {what}")),
            Progress::Lines => say(&serde_json::json!({ "note": what }).to_string()),
        }
    }

    /// A group of meters drawn together (one bar per line on a terminal).
    pub fn group(self) -> Group {
        let target = match self {
            Progress::Bar if std::io::stderr().is_terminal() => ProgressDrawTarget::stderr(),
            _ => ProgressDrawTarget::hidden(),
        };
        Group {
            mode: self,
            multi: MultiProgress::with_draw_target(target),
        }
    }

    /// A spinner for step `step` that counts nothing, showing `what` and the time spent
    /// (scanning a dataset's shards); its JSON lines have `"unit": null`.
    pub fn spinner(self, step: &'static str, what: String) -> Meter {
        let m = self.group().make(step, None, None);
        m.bar.set_message(what);
        m
    }

    /// One meter on its own: step `step` (a short word: `pack`, `index`, `walk`, …) counting
    /// `unit`s of `total` (`None`: not known, a spinner).
    pub fn meter(self, step: &'static str, unit: Unit, total: Option<u64>) -> Meter {
        self.group().meter(step, unit, total)
    }
}

/// Meters drawn together: the pin's and the warm's bars of `--wait`.
pub struct Group {
    mode: Progress,
    multi: MultiProgress,
}

impl Group {
    /// A meter of this group (see [`Progress::meter`]).
    pub fn meter(&self, step: &'static str, unit: Unit, total: Option<u64>) -> Meter {
        self.make(step, Some(unit), total)
    }

    fn make(&self, step: &'static str, unit: Option<Unit>, total: Option<u64>) -> Meter {
        let bar = match total {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::new_spinner(),
        };
        let template = match (total, unit) {
            (_, None) => "{spinner} {prefix} {msg} ({elapsed})",
            (Some(_), Some(Unit::Bytes)) => {
                "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}"
            }
            (Some(_), Some(_)) => {
                "{prefix:>8} [{bar:30}] {human_pos}/{human_len} {unit} ({elapsed}, ETA {eta}) {msg}"
            }
            (None, Some(Unit::Bytes)) => "{spinner} {prefix} {bytes} ({elapsed}) {msg}",
            (None, Some(_)) => "{spinner} {prefix} {human_pos} {unit} ({elapsed}) {msg}",
        };
        let template = template.replace("{unit}", unit.map_or("", Unit::name));
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(step);
        let bar = self.multi.add(bar);
        if total.is_none() && !self.multi.is_hidden() {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        let m = Meter {
            bar,
            lines: self.mode == Progress::Lines,
            step,
            unit,
            total: AtomicU64::new(total.unwrap_or(u64::MAX)),
            done: AtomicU64::new(0),
            files: AtomicU64::new(u64::MAX),
            last: Mutex::new(None),
            ended: AtomicBool::new(false),
        };
        m.line(false);
        m
    }
}

/// The progress of one step: an indicatif bar (or spinner), or JSON lines (the module note).
/// Shared across threads (`&Meter` is `Sync`); ends when [`Meter::finish`] is called or it
/// is dropped.
pub struct Meter {
    bar: ProgressBar,
    lines: bool,
    step: &'static str,
    /// `None`: a spinner that counts nothing.
    unit: Option<Unit>,
    /// `u64::MAX` while unknown.
    total: AtomicU64,
    done: AtomicU64,
    /// Files written, for `pack`'s lines (`u64::MAX`: not counted).
    files: AtomicU64,
    last: Mutex<Option<Instant>>,
    ended: AtomicBool,
}

impl Meter {
    /// `n` more units done.
    pub fn inc(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        self.bar.inc(n);
        self.line(false);
    }

    /// `done` units done in all (at most the total).
    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.bar.set_position(done);
        self.line(false);
    }

    /// The step's length became known (or changed): `total` units.
    pub fn set_total(&self, total: u64) {
        if self.total.swap(total, Ordering::Relaxed) != total {
            self.bar.set_length(total);
        }
    }

    /// `files` files written, shown after the bar and in `pack`'s lines.
    pub fn set_files(&self, files: u64, per_sec: f64) {
        self.files.store(files, Ordering::Relaxed);
        self.bar
            .set_message(format!("{files} files ({per_sec:.0} files/s)"));
    }

    /// Ends the step: the bar stays drawn at its end, a last line says `"end": true`.
    pub fn finish(&self) {
        if !self.ended.swap(true, Ordering::Relaxed) {
            self.line(true);
            self.bar.finish();
        }
    }

    /// Ends the step and removes its bar or spinner from the terminal.
    pub fn finish_and_clear(&self) {
        if !self.ended.swap(true, Ordering::Relaxed) {
            self.line(true);
            self.bar.finish_and_clear();
        }
    }

    /// Ends a step that failed: the bar stays where it stopped.
    pub fn abandon(&self) {
        if !self.ended.swap(true, Ordering::Relaxed) {
            self.line(true);
            self.bar.abandon();
        }
    }

    /// Prints a JSON line if lines are on and one is due (`end`: always).
    fn line(&self, end: bool) {
        if !self.lines {
            return;
        }
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if !end && last.is_some_and(|t| t.elapsed() < LINE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let total = self.total.load(Ordering::Relaxed);
        let mut p = serde_json::json!({
            "step": self.step,
            "unit": self.unit.map(Unit::name),
            "done": self.done.load(Ordering::Relaxed),
            "total": (total != u64::MAX).then_some(total),
        });
        let files = self.files.load(Ordering::Relaxed);
        if files != u64::MAX {
            p["files"] = files.into();
        }
        if end {
            p["end"] = true.into();
        }
        say(&serde_json::json!({ "progress": p }).to_string());
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_meter_counts_from_many_threads_and_ends_once() {
        let m = Progress::None.meter("index", Unit::Samples, Some(1000));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..250).for_each(|_| m.inc(1)));
            }
        });
        assert_eq!(m.done.load(Ordering::Relaxed), 1000);
        m.finish();
        assert!(m.ended.load(Ordering::Relaxed));
        m.abandon(); // a second end changes nothing
        assert_eq!(m.bar.position(), 1000);
    }

    #[test]
    fn flags_choose_the_mode() {
        assert_eq!(Progress::from_flags(true, true), Progress::Lines);
        assert_eq!(Progress::from_flags(false, true), Progress::None);
        assert_eq!(Progress::from_flags(false, false), Progress::Bar);
    }
}
