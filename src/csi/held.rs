//! The connections the node plugin holds: a copy of every published volume's FUSE descriptor,
//! so that a mounter that ends (its container restarted, upgraded or OOM-killed) loses no
//! volume. The plugin watches each volume's connection to the mounter; when it closes without
//! the volume's end (`exited`), the plugin waits for a mounter to listen again and hands it a
//! copy of the descriptor with the keeper's offer line ([`Event::Kept`]): the new mounter's
//! keeper resends what the dead daemon held and starts a daemon on the same connection
//! (`crate::mount::keeper`). Readers see a pause; the kubelet sees nothing.
//!
//! Limits: a node plugin that restarts loses its copies (the volumes keep serving; a mounter
//! restart after that ends them, as before); a volume whose keeper never said its offer line
//! (it ended before serving) is not handed over.

use super::mounter::{self, Event, Request};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the plugin waits for a mounter to listen again before it gives a volume up.
const MOUNTER_BACK_WITHIN: Duration = Duration::from_secs(600);

/// What a volume's watcher hears: the mounter's events, then the connection's end (the
/// channel closes).
pub(super) type Events = Receiver<Event>;

/// One published volume the plugin holds.
pub(super) struct Held {
    /// The volume id, for logs.
    pub volume_id: String,
    /// The target path.
    pub target: PathBuf,
    /// The mount source its mounts show (`loosefs:csi/VOLUME`).
    pub source_name: String,
    /// The plugin's copy of the connection's descriptor.
    pub dev: OwnedFd,
    /// What the mounter was asked; `kept` is filled in from the keeper's offer line.
    pub req: Request,
}

/// Target → the generation of its watcher (a new publish of a target, or its unpublish, ends
/// the older watcher).
fn watched() -> &'static Mutex<HashMap<PathBuf, u64>> {
    static W: OnceLock<Mutex<HashMap<PathBuf, u64>>> = OnceLock::new();
    W.get_or_init(Mutex::default)
}

fn current(target: &Path, generation: u64) -> bool {
    let w = watched().lock().unwrap_or_else(|p| p.into_inner());
    w.get(target) == Some(&generation)
}

/// Stops holding `target`'s connection (its unpublish).
pub(super) fn forget(target: &Path) {
    let mut w = watched().lock().unwrap_or_else(|p| p.into_inner());
    w.remove(target);
}

/// Holds `held` and watches `events` (the mounter's, after the volume was ready) on a thread of
/// its own, handing the volume to a new mounter at `mounter_socket` whenever the old one ends.
pub(super) fn watch(mounter_socket: PathBuf, mut held: Held, mut events: Events) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let generation = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    watched()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(held.target.clone(), generation);
    std::thread::spawn(move || {
        loop {
            match events.recv() {
                Ok(Event::Kept { line }) => held.req.kept = Some(line),
                Ok(Event::Exited { code, tail }) => {
                    log::info!(
                        "volume {}: its keeper ended ({code}){}",
                        held.volume_id,
                        if tail.is_empty() {
                            String::new()
                        } else {
                            format!(": {tail}")
                        }
                    );
                    break;
                }
                Ok(Event::Started { .. }) => {}
                // The mounter closed the connection without the volume's end: it ended.
                Err(_) => {
                    if !current(&held.target, generation) {
                        break;
                    }
                    match hand_again(&mounter_socket, &held, generation) {
                        Some(e) => events = e,
                        None => break,
                    }
                }
            }
        }
        let mut w = watched().lock().unwrap_or_else(|p| p.into_inner());
        if w.get(&held.target) == Some(&generation) {
            w.remove(&held.target);
        }
    });
}

/// Hands `held` to the next mounter that listens at `socket`, as a kept connection; its
/// events, or `None` when the volume cannot or need not be handed (unpublished meanwhile,
/// unmounted, no offer line, no mounter within [`MOUNTER_BACK_WITHIN`]).
fn hand_again(socket: &Path, held: &Held, generation: u64) -> Option<Events> {
    let id = &held.volume_id;
    let Some(line) = &held.req.kept else {
        log::error!("volume {id}: its mounter ended before the volume's keeper served; it ends");
        return None;
    };
    log::warn!("volume {id}: its mounter ended; handing it to the next mounter");
    let t0 = Instant::now();
    let mut wait = Duration::from_millis(50);
    loop {
        if !current(&held.target, generation)
            || !crate::mount_table::is_loosefs_mount_of(&held.target, &held.source_name)
            || !crate::mount::keeper::alive(std::os::fd::AsFd::as_fd(&held.dev))
        {
            log::info!("volume {id}: unpublished or ended meanwhile; not handed over");
            return None;
        }
        if let Ok((conn, _)) = mounter::connect(socket) {
            let dev = held.dev.try_clone().ok()?;
            match mounter::hand_over(conn, dev, &held.req, socket) {
                Ok(events) => {
                    log::info!(
                        "volume {id}: handed to the new mounter (offer {line}) after {:.1} s",
                        t0.elapsed().as_secs_f64()
                    );
                    return Some(forward(events));
                }
                Err(e) => log::warn!("volume {id}: {e:#}; trying again"),
            }
        }
        if t0.elapsed() > MOUNTER_BACK_WITHIN {
            log::error!(
                "volume {id}: no mounter listens at {} after {} s; the volume ends",
                socket.display(),
                MOUNTER_BACK_WITHIN.as_secs()
            );
            return None;
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// The mounter's events on a channel, which closes when the mounter's connection does.
pub(super) fn forward(events: impl Iterator<Item = Event> + Send + 'static) -> Events {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for e in events {
            if tx.send(e).is_err() {
                break;
            }
        }
    });
    rx
}
