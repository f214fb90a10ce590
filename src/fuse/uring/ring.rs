//! The ring entries of FUSE over io_uring: one thread per entry, each with its own io_uring
//! (128-byte SQEs, as the kernel requires) holding one entry of one queue: a 288-byte header
//! buffer and a payload buffer registered with `FUSE_IO_URING_CMD_REGISTER`, then a loop of
//! answer, `COMMIT_AND_FETCH`, wait. A thread waiting for the disk holds its entry only: the
//! kernel gives the next request of that queue to another entry, as fuser's threads share
//! `/dev/fuse` (so `--threads` keeps its meaning, split over the queues, at least
//! [`MIN_PER_QUEUE`] each). Entries are made before INIT and registered all or none
//! ([`Prepared`]).

use super::{Handler, abi};
use crate::stats::TransportStats;
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Bytes of each entry's payload buffer, and the `max_write` asked at INIT: the kernel
/// requires at least `max(max_write, max_pages × 4 KiB)` (`fs/fuse/dev_uring.c`), and
/// `max_pages` is 256 (1 MiB READs) by default.
pub const PAYLOAD: usize = 1 << 20;

/// The `fuse` module's switch (root may write it; off by default).
const ENABLE: &str = "/sys/module/fuse/parameters/enable_uring";

/// Makes FUSE over io_uring available: `enable_uring` is on, or turned on here (root).
/// Errors: why not (no such parameter: a kernel without it; not allowed to turn it on).
pub fn enable() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE) {
        Err(e) => Err(format!(
            "{ENABLE}: {e} (a kernel without FUSE over io_uring)"
        )),
        Ok(v) if matches!(v.trim(), "Y" | "1") => Ok(()),
        Ok(_) => std::fs::write(ENABLE, "Y")
            .map(|()| log::info!("turned on {ENABLE}"))
            .map_err(|e| format!("{ENABLE} is off and cannot be turned on: {e}")),
    }
}

/// Queues of the ring: one per possible CPU (`/sys/devices/system/cpu/possible`, e.g.
/// `0-3,8-11`), as the kernel makes them.
fn possible_cpus() -> usize {
    cpus_in(&std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default())
}

/// CPUs in a kernel CPU list (`0-3,8-11`: 8); at least 1.
fn cpus_in(text: &str) -> usize {
    let count: usize = text
        .trim()
        .split(',')
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            (b.parse::<usize>().ok()? + 1).checked_sub(a.parse::<usize>().ok()?)
        })
        .sum();
    count.max(1)
}

/// Ring entries each queue has at least, whatever `--threads` asks: the kernel queues a
/// request on the queue of the CPU its caller runs on and holds it there until one of that
/// queue's entries is free, so with one entry per queue a single slow READ (a GET being
/// retried) would stall every other request from that CPU while other queues idle. Each
/// entry costs a thread and a 1 MiB payload buffer, touched only as far as replies fill it.
pub const MIN_PER_QUEUE: usize = 4;

/// Ring entries made ready before the mount's INIT is answered: one thread per entry, each
/// with its io_uring set up, waiting to register. Everything that can fail for lack of
/// resources (threads, io_uring instances, descriptors: `RLIMIT_NOFILE`, `RLIMIT_MEMLOCK`)
/// fails here, while the mount can still go through `/dev/fuse`: once INIT accepts FUSE over
/// io_uring, the kernel holds every request until each queue has an entry
/// (`fuse_block_alloc` in `fs/fuse/dev.c`), so entries are registered all or none.
pub struct Prepared {
    go: Vec<std::sync::mpsc::Sender<i32>>,
    registered: std::sync::mpsc::Receiver<Result<(), String>>,
    queues: usize,
}

/// Ring entries (one thread and one io_uring each) for `threads`: split over the queues, at
/// least [`MIN_PER_QUEUE`] per queue.
pub fn entries(threads: usize) -> usize {
    let queues = possible_cpus();
    threads.div_ceil(queues).max(MIN_PER_QUEUE) * queues
}

impl Prepared {
    /// `threads` entries over the ring's queues (one per possible CPU), at least
    /// [`MIN_PER_QUEUE`] per queue, answering with `handler`. Errors: why an entry could
    /// not be made (the threads already started end).
    pub fn new(threads: usize, handler: Handler) -> Result<Prepared, String> {
        let queues = possible_cpus();
        let per_queue = threads.div_ceil(queues).max(MIN_PER_QUEUE);
        let handler = Arc::new(handler);
        let (tx, made) = std::sync::mpsc::channel();
        let (done, registered) = std::sync::mpsc::channel();
        let mut go = Vec::with_capacity(queues * per_queue);
        for qid in 0..queues {
            for k in 0..per_queue {
                let (handler, tx, done) = (handler.clone(), tx.clone(), done.clone());
                let (go_tx, go_rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name(format!("uring-{qid}.{k}"))
                    .spawn(move || RingEntry::run(qid as u16, &handler, &tx, &go_rx, &done))
                    .map_err(|e| format!("cannot start a ring thread: {e}"))?;
                go.push(go_tx);
            }
        }
        drop(tx);
        for _ in 0..go.len() {
            match made.recv() {
                Ok(Ok(())) => {}
                // Dropping `go` ends every thread still waiting.
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err("a ring thread ended before it was ready".into()),
            }
        }
        Ok(Prepared {
            go,
            registered,
            queues,
        })
    }
}

/// Starts the prepared ring of the mount at `mnt` served through `dev` (a descriptor of its
/// `/dev/fuse`): waits until INIT is answered, then registers every entry. Returns once every
/// entry is registered, with `stats` set. Errors: INIT did not offer the ring (requests go
/// through `/dev/fuse`), or an entry was refused after INIT accepted the ring: the mount can
/// then serve nothing and the caller must take it down.
pub fn start(
    prepared: Prepared,
    dev: OwnedFd,
    mnt: &Path,
    stats: &TransportStats,
) -> Result<(), StartError> {
    // INIT is answered by a fuser thread; once it is, every request waits for the ring
    // (`fuse_block_alloc`), so nothing can be asked of the mount to learn it.
    let t0 = std::time::Instant::now();
    while !stats.init_done.load(Relaxed) {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(StartError::Refused(format!(
                "no INIT from the kernel for {} in 30 s",
                mnt.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if !stats.offered.load(Relaxed) {
        return Err(StartError::NotOffered(
            "the kernel did not offer FUSE_OVER_IO_URING at INIT".into(),
        ));
    }
    // The descriptor stays open for the life of the process (the threads use its number).
    let fd = dev.as_raw_fd();
    std::mem::forget(dev);
    let entries = prepared.go.len();
    for go in &prepared.go {
        let _ = go.send(fd);
    }
    for _ in 0..entries {
        match prepared.registered.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StartError::Refused(e)),
            Err(e) => {
                return Err(StartError::Refused(format!(
                    "ring entries not registered: {e}"
                )));
            }
        }
    }
    stats.queues.store(prepared.queues, Relaxed);
    stats.threads.store(entries, Relaxed);
    stats.uring.store(true, Relaxed);
    Ok(())
}

/// Why the ring did not start.
#[derive(Debug)]
pub enum StartError {
    /// INIT did not accept the ring: the mount serves through `/dev/fuse`.
    NotOffered(String),
    /// The ring was accepted and then not registered in full: the mount serves nothing.
    Refused(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::NotOffered(e) | StartError::Refused(e) => f.write_str(e),
        }
    }
}

/// Runs the calling thread on CPU `cpu` only: the kernel queues a request on the queue of the
/// CPU its caller runs on, so the entry's thread wakes where the caller went to sleep (no
/// wake-up of another, idle vCPU). Where the CPU is not ours to use, the thread stays free.
fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = pinned {
        log::debug!("ring thread of queue {cpu} not pinned to its CPU: {e}");
    }
}

/// One ring entry and the io_uring that carries its commands.
struct RingEntry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// `struct fuse_uring_req_header` (the kernel copies it byte-wise: no alignment needed).
    header: Box<[u8; abi::HEADER_LEN]>,
    payload: Vec<u8>,
    /// The request's payload, copied out before the reply is written over it.
    input: Vec<u8>,
    /// Header and payload buffers, as `REGISTER` names them (read by the kernel then).
    iov: [libc::iovec; 2],
    fd: i32,
    qid: u16,
}

/// `-errno` results that mean the connection is gone (unmounted or aborted).
fn is_end(res: i32) -> bool {
    [
        libc::ENOTCONN,
        libc::ECONNABORTED,
        libc::ENODEV,
        libc::ECANCELED,
    ]
    .contains(&-res)
}

impl RingEntry {
    fn new(fd: i32, qid: u16) -> std::io::Result<Box<RingEntry>> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(2)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2))?;
        let mut e = Box::new(RingEntry {
            ring,
            header: Box::new([0u8; abi::HEADER_LEN]),
            payload: vec![0u8; PAYLOAD],
            input: Vec::new(),
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
            fd,
            qid,
        });
        e.iov = [
            libc::iovec {
                iov_base: e.header.as_mut_ptr().cast(),
                iov_len: abi::HEADER_LEN,
            },
            libc::iovec {
                iov_base: e.payload.as_mut_ptr().cast(),
                iov_len: PAYLOAD,
            },
        ];
        Ok(e)
    }

    /// Queues a command (`REGISTER` or `COMMIT_AND_FETCH`) for this entry.
    fn push(&mut self, cmd_op: u32, commit_id: u64) -> std::io::Result<()> {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_le_bytes());
        let sqe = uring_cmd(self.fd, cmd_op, cmd, self.iov.as_ptr() as u64);
        // SAFETY: the iovecs and the buffers they name live as long as `self`, which lives
        // until the ring (and so every command) is gone.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))
    }

    /// Submits what is queued and waits for one completion: its result (0: a request is in
    /// the buffers; `-errno` otherwise).
    fn wait(&mut self) -> std::io::Result<i32> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(c) = self.ring.completion().next() {
                return Ok(c.result());
            }
        }
    }

    /// Sets up the entry's io_uring and reports it on `made`; then, given the mount's
    /// `/dev/fuse` descriptor on `go` (nothing: the ring is not used and the thread ends),
    /// registers the entry, reports it on `registered`, and serves until the connection ends.
    fn run(
        qid: u16,
        handler: &Handler,
        made: &std::sync::mpsc::Sender<Result<(), String>>,
        go: &std::sync::mpsc::Receiver<i32>,
        ready: &std::sync::mpsc::Sender<Result<(), String>>,
    ) {
        pin_to_cpu(qid as usize);
        let mut e = match RingEntry::new(-1, qid) {
            Ok(e) => e,
            Err(err) => {
                let _ = made.send(Err(format!("cannot set up an io_uring: {err}")));
                return;
            }
        };
        let _ = made.send(Ok(()));
        let Ok(fd) = go.recv() else {
            return;
        };
        e.fd = fd;
        // Issued at submission: an error completes at once, a registered entry waits.
        // EAGAIN: the kernel has not yet taken the INIT reply (sent just after `init_done`).
        let t0 = std::time::Instant::now();
        let first = loop {
            if let Err(err) = e.push(abi::CMD_REGISTER, 0).and_then(|()| e.ring.submit()) {
                let _ = ready.send(Err(format!("cannot register a ring entry: {err}")));
                return;
            }
            match e.ring.completion().next().map(|c| c.result()) {
                Some(r) if r == -libc::EAGAIN && t0.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Some(r) if r < 0 => {
                    let err = std::io::Error::from_raw_os_error(-r);
                    let _ = ready.send(Err(format!("cannot register a ring entry: {err}")));
                    return;
                }
                other => break other,
            }
        };
        let _ = ready.send(Ok(()));
        let mut next = first;
        let mut served = false;
        // The last command was a REGISTER with no request since: a failure then stops the entry.
        let mut registering = true;
        loop {
            let res = match next.take().map_or_else(|| e.wait(), Ok) {
                Ok(r) => r,
                Err(err) => return log::error!("ring queue {qid}: {err}"),
            };
            if res == -libc::EAGAIN && !served && t0.elapsed() < Duration::from_secs(30) {
                // A REGISTER that io_uring retried in a worker thread, still before INIT.
                std::thread::sleep(Duration::from_millis(1));
            } else if res < 0 && (is_end(res) || registering) {
                if !is_end(res) {
                    log::error!(
                        "ring queue {qid}: registering an entry: {}; this entry stops",
                        std::io::Error::from_raw_os_error(-res)
                    );
                }
                return;
            } else if res < 0 {
                // A commit the kernel refused leaves this entry without a command: registered
                // again, so the queue keeps its entries.
                static REFUSED: std::sync::LazyLock<crate::stats::LogLimit> =
                    std::sync::LazyLock::new(Default::default);
                REFUSED.log(|| {
                    format!(
                        "ring queue {qid}: a reply was refused ({}); registering the entry again",
                        std::io::Error::from_raw_os_error(-res)
                    )
                });
            } else {
                served = true;
                registering = false;
                let commit = e.serve(handler);
                if let Err(err) = e.push(abi::CMD_COMMIT_AND_FETCH, commit) {
                    return log::error!("ring queue {qid}: {err}");
                }
                continue;
            }
            registering = true;
            if let Err(err) = e.push(abi::CMD_REGISTER, 0) {
                return log::error!("ring queue {qid}: {err}");
            }
        }
    }

    /// Answers the request in the buffers; returns its commit id.
    fn serve(&mut self, handler: &Handler) -> u64 {
        handler.serve_entry(&mut self.header, &mut self.payload, &mut self.input)
    }
}

/// Byte of `struct io_uring_sqe` where its `len` (u32) lies (`include/uapi/linux/io_uring.h`:
/// opcode, flags, ioprio, fd, off/cmd_op, addr, then len).
const SQE_LEN_AT: usize = 24;

/// A 128-byte `IORING_OP_URING_CMD` entry on `fd` with command `cmd_op`, the 80 command
/// bytes `cmd`, and `addr` naming two iovecs (`len` 2: the `io-uring` crate has no setter for
/// `len` on this opcode, so it is written at [`SQE_LEN_AT`]; the layout is pinned by a test).
fn uring_cmd(fd: i32, cmd_op: u32, cmd: [u8; 80], addr: u64) -> squeue::Entry128 {
    let mut sqe = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(Some(addr))
        .build();
    // SAFETY: `Entry128` is `#[repr(C)]` over `struct io_uring_sqe` (128 bytes), whose `len`
    // (u32) is at byte SQE_LEN_AT (checked by `the_sqe_layout_is_the_kernels`); the write
    // stays inside the entry.
    unsafe {
        (&mut sqe as *mut squeue::Entry128)
            .cast::<u8>()
            .add(SQE_LEN_AT)
            .cast::<u32>()
            .write_unaligned(2)
    };
    sqe
}

#[cfg(test)]
mod sqe_tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted_as_the_kernel_writes_them() {
        assert_eq!(cpus_in("0-3,8-11\n"), 8);
        assert_eq!(cpus_in("0\n"), 1);
        assert_eq!(cpus_in("0-1"), 2);
        assert_eq!(cpus_in("0,2,4-5"), 4);
        assert_eq!(cpus_in(""), 1, "unreadable: one queue");
        assert_eq!(cpus_in("3-1"), 1, "nonsense: one queue");
    }

    /// The entry's bytes as the kernel reads them: the fields `io-uring` sets where
    /// `struct io_uring_sqe` has them, and the length written by hand at byte 24.
    #[test]
    fn the_sqe_layout_is_the_kernels() {
        assert_eq!(std::mem::size_of::<squeue::Entry128>(), 128);
        let mut cmd = [0u8; 80];
        cmd[0] = 0xA5;
        cmd[79] = 0x5A;
        let sqe = uring_cmd(7, 0x1234_5678, cmd, 0xDEAD_BEEF_0000_1000);
        // SAFETY: Entry128 is 128 plain bytes (asserted above).
        let b: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(b[0], 46, "opcode IORING_OP_URING_CMD");
        assert_eq!(i32::from_le_bytes(b[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            0x1234_5678,
            "cmd_op"
        );
        assert_eq!(
            u64::from_le_bytes(b[16..24].try_into().unwrap()),
            0xDEAD_BEEF_0000_1000,
            "addr"
        );
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 2, "len");
        assert_eq!(
            (b[48], b[127]),
            (0xA5, 0x5A),
            "the 80 command bytes at 48..128"
        );
    }
}
