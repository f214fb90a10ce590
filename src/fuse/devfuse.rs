//! The `/dev/fuse` transport: [`LooseFs`], the fuser 0.18 adaptor. It translates fuser's
//! calls into [`Fs`] calls and answers with the reply helpers of [`super`]; with FUSE over
//! io_uring ([`super::uring`]) it still handles INIT, FORGET and the notifications.

use super::backing::BackingIds;
use super::takeover::InitOffer;
use super::uring;
use super::{errno, failed, file_attr, file_type, negative_attr, read_guarded};
use crate::catalog::{Attr, FsError};
use crate::fs::{Entry, Fs, TTL};
use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A [`Fs`] over FUSE.
pub struct LooseFs {
    server: Arc<Fs>,
    uid: u32,
    gid: u32,
    /// Backing ids of files open under passthrough, by inode (the file handle is the inode).
    backing: Mutex<BackingIds>,
    /// Ask the kernel for FUSE over io_uring at INIT ([`uring`]).
    uring: bool,
    /// Where the kernel's INIT offer is recorded, for a keeper to hand to later daemons.
    offer: Option<Arc<std::sync::OnceLock<InitOffer>>>,
}

impl LooseFs {
    /// Serves `server`; files appear owned by `uid`/`gid`.
    pub fn new(server: Arc<Fs>, uid: u32, gid: u32) -> LooseFs {
        LooseFs {
            server,
            uid,
            gid,
            backing: Mutex::default(),
            uring: false,
            offer: None,
        }
    }

    /// Records the kernel's FUSE_INIT offer in `to` when INIT comes (a kept mount hands it to
    /// the daemons that take over, [`super::takeover`]).
    pub fn recording_offer(mut self, to: Arc<std::sync::OnceLock<InitOffer>>) -> LooseFs {
        self.offer = Some(to);
        self
    }

    /// Asks the kernel for FUSE over io_uring at INIT (`uring::start` registers the ring
    /// once INIT is done); `max_write` becomes the ring's payload size.
    pub fn with_uring(mut self, on: bool) -> LooseFs {
        self.uring = on;
        self
    }

    /// Passthrough cannot go on (no privilege, a file system the kernel cannot stack on):
    /// logged once; this OPEN and every later one answer ENOSYS, so the kernel stops sending
    /// them and the daemon serves READs.
    fn stop_passthrough(&self, why: &std::io::Error, reply: ReplyOpen) {
        if self.server.set_passthrough(false) {
            log::warn!("passthrough refused by the kernel ({why}); the daemon reads files");
        }
        reply.error(Errno::ENOSYS);
    }

    /// The kernel settings asked for at INIT (see the module doc).
    fn configure(&self, config: &mut KernelConfig) {
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS) {
            log::warn!(
                "kernel does not offer {missing:?}; lookups in one directory are serialised"
            );
        }
        // READDIRPLUS without READDIRPLUS_AUTO: every listing returns the attributes too, so a
        // loader that lists and then opens (ImageFolder, DALI) needs no LOOKUP per file.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS) {
            log::warn!("kernel does not offer {missing:?}; every file costs a LOOKUP");
        }
        let _ = config.set_max_background(64);
        if self.uring {
            let _ = config.set_max_write(uring::PAYLOAD as u32);
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => self.server.stats.transport.offered.store(true, Relaxed),
                Err(m) => log::warn!("kernel does not offer {m:?}; requests go through /dev/fuse"),
            }
            self.server.stats.transport.init_done.store(true, Relaxed);
        }
        // Passthrough: the backing files may sit on a stacked file system (overlayfs in a
        // container), so the mount takes the largest stack depth, 2.
        if self.server.passthrough_possible() {
            let on = config.set_max_stack_depth(2).is_ok()
                && config
                    .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                    .inspect_err(|m| {
                        log::warn!("kernel does not offer {m:?}; the daemon reads files")
                    })
                    .is_ok();
            if !on {
                let _ = config.set_max_stack_depth(0);
            }
            self.server.set_passthrough(on);
        }
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        file_attr(a, self.uid, self.gid)
    }

    fn entry(&self, reply: ReplyEntry, e: &Entry) {
        reply.entry_with_ttls(&e.ttl, &e.ttl, &self.file_attr(&e.attr), Generation(0));
    }

    fn fail(&self, op: &str, ino: u64, e: &FsError) -> Errno {
        failed(&self.server, op, ino, e)
    }
}

/// Filesystem methods that would change the tree: each answers EROFS (the mount is not
/// mounted read-only, so that `.loosefs/order` takes writes; nothing else does).
macro_rules! read_only {
    ($($name:ident($($arg:ident: $t:ty),*) -> $reply:ty;)*) => {
        $(
            fn $name(&self, _req: &Request, $(_: $t,)* reply: $reply) {
                reply.error(errno(&self.server.refuse()));
            }
        )*
    };
}

impl Filesystem for LooseFs {
    read_only! {
        mknod(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> ReplyEntry;
        mkdir(parent: INodeNo, name: &OsStr, mode: u32, umask: u32) -> ReplyEntry;
        unlink(parent: INodeNo, name: &OsStr) -> ReplyEmpty;
        rmdir(parent: INodeNo, name: &OsStr) -> ReplyEmpty;
        symlink(parent: INodeNo, name: &OsStr, target: &Path) -> ReplyEntry;
        rename(parent: INodeNo, name: &OsStr, to: INodeNo, to_name: &OsStr, f: RenameFlags)
            -> ReplyEmpty;
        link(ino: INodeNo, parent: INodeNo, name: &OsStr) -> ReplyEntry;
        create(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32) -> ReplyCreate;
        setxattr(ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, position: u32)
            -> ReplyEmpty;
        removexattr(ino: INodeNo, name: &OsStr) -> ReplyEmpty;
        fallocate(ino: INodeNo, fh: FileHandle, offset: u64, len: u64, mode: i32) -> ReplyEmpty;
    }

    /// A write: `.loosefs/order` takes an announced order, anything else answers EROFS.
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.server.write(ino.0, offset, data, req.pid()) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.fail("write", ino.0, &e)),
        }
    }

    /// Only `.loosefs/order` may be truncated (`open(O_TRUNC)`); anything else answers EROFS.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.server.setattr(ino.0, size) {
            Ok(e) => reply.attr(&e.ttl, &self.file_attr(&e.attr)),
            Err(e) => reply.error(self.fail("setattr", ino.0, &e)),
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Some(to) = &self.offer {
            let _ = to.set(InitOffer::of(config));
        }
        self.configure(config);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.server.lookup_as(req.uid(), parent.0, name.as_bytes()) {
            Ok(e) => self.entry(reply, &e),
            // An entry with inode 0 is a negative entry the kernel caches for TTL.
            Err(FsError::NotFound) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(self.fail("lookup", parent.0, &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.server.forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.server.getattr(ino.0) {
            Ok(e) => reply.attr(&e.ttl, &self.file_attr(&e.attr)),
            Err(e) => reply.error(self.fail("getattr", ino.0, &e)),
        }
    }

    /// Zero-message open: ENOSYS makes the kernel stop sending OPEN and RELEASE for the whole
    /// connection and keep file pages cached across opens (as `FOPEN_KEEP_CACHE`). An open for
    /// writing succeeds too; its writes answer EROFS (`.loosefs/order` excepted).
    ///
    /// Under passthrough (a loose directory) a file's OPEN is answered with its original
    /// file instead, and the kernel reads it with no READ round trip; a view or control file
    /// opens as usual (pages kept).
    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if !self.server.passthrough() {
            self.server.open();
            return reply.error(Errno::ENOSYS);
        }
        match self.server.open_backing(ino.0) {
            Ok(Some(file)) => {
                let mut held = self.backing.lock().unwrap_or_else(|p| p.into_inner());
                match held.open(ino.0, || reply.open_backing(&*file)) {
                    Ok(id) => reply.opened_passthrough(FileHandle(ino.0), FopenFlags::empty(), id),
                    Err(e) => {
                        drop(held);
                        self.stop_passthrough(&e, reply)
                    }
                }
            }
            Ok(None) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(self.fail("open", ino.0, &e)),
        }
    }

    /// The end of a passthrough open: its backing id idles after the last one.
    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        (self.backing.lock().unwrap_or_else(|p| p.into_inner())).release(fh.0);
        reply.ok();
    }

    /// Python's `open()` asks `isatty` (TCGETS) on every file: answer ENOTTY at once, quietly.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.server.ioctl();
        reply.error(Errno::ENOTTY);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The reply may be sent later from a decode thread (decoded views); a dropped reply
        // answers EIO (fuser).
        read_guarded(&self.server, ino.0, offset, size, move |r| match r {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(errno(&e)),
        });
    }

    /// Nothing to flush (an announced order is in force once written); ENOSYS once stops the
    /// kernel sending FLUSH.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// Zero-message opendir: as for `open`, and the kernel then caches directory listings.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.server.readdir(ino.0, offset, |e| {
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                file_type(e.kind),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("readdir", ino.0, &e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.server.readdirplus(ino.0, offset, |e, entry| {
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                OsStr::from_bytes(&e.name),
                &entry.ttl,
                &self.file_attr(&entry.attr),
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("readdirplus", ino.0, &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.server.statfs();
        reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize);
    }
}
