//! Serving frames: each made file of a frame tree ([`super::tree`]) is a frame of a video
//! file behind a view header (`.npy` or PPM), or bytes made at mount (a column's `.npy`).
//!
//! A frame's READ is answered from the GOP cache when its GOP is there (on the FUSE thread: a
//! copy of the slice asked for). Otherwise the read joins the single flight of that GOP: the
//! first miss hands the decode of the whole GOP ([`decoder::decode_gop`]) to a pool of decode
//! threads, every read queued on it is answered when it is done, and each GOP is decoded once
//! however many readers want its frames. A miss on the GOP right after one missed lately in
//! the same file (a reader walking an episode: episode order is file order) has the GOP after
//! it decoded ahead; a shuffled reader's misses do not (decoding ahead for them doubled the
//! decode work: a shuffled pass over 4,000 frames of the 20,000-frame set decoded 12,958 frames
//! for 6,564 GOPs). The cache holds whole GOPs, least recently used
//! evicted past its budget; a GOP that fails to decode answers EIO to its readers (logged
//! once per GOP) and is not kept, so a later read tries again.
//!
//! A GOP whose frames would not fit in the budget shared by the decode threads (one keyframe
//! in a long screen recording: 300 frames of 2048² are 3.8 GB) is decoded to the frames asked
//! and the ones after them that fit ([`FrameServer::window`]), the rest decoded and dropped;
//! that part is what the cache keeps, and a read of a frame outside it decodes again. Memory
//! stays within the budget (at least one frame per decode thread), whatever the GOP.

use super::decoder::{self, VideoIndex};
use crate::catalog::FsError;
use crate::decode::Reply;
use crate::view::{ViewKind, header};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// What a made file holds.
#[derive(Debug, Clone)]
pub enum Made {
    /// Frame `pts` of GOP `gop` of video `video`, as a view of `kind`.
    Frame {
        /// Index into the server's videos.
        video: u32,
        /// GOP of that video holding it.
        gop: u32,
        /// Its presentation timestamp.
        pts: i64,
        /// The view's format.
        kind: ViewKind,
    },
    /// Bytes made at mount.
    Bytes(Arc<[u8]>),
    /// A file whose content cannot be made (a row with no frame within the tolerance): its
    /// reads answer EIO with `why`; `size` is what it would hold.
    Missing {
        /// Why, with the file named.
        why: Arc<str>,
        /// Size shown, bytes.
        size: u64,
    },
}

/// Counters of the frame server.
#[derive(Debug, Default)]
pub struct FrameStats {
    /// GOPs decoded.
    pub gops: AtomicU64,
    /// Frames decoded (in those GOPs).
    pub frames: AtomicU64,
    /// GOPs that failed to decode.
    pub failures: AtomicU64,
    /// READs answered from the cache.
    pub hits: AtomicU64,
    /// READs that started a decode.
    pub misses: AtomicU64,
    /// READs that waited for a decode under way.
    pub joined: AtomicU64,
    /// GOPs decoded ahead of a reader.
    pub ahead: AtomicU64,
    /// Bytes of pixels in the cache now.
    pub cached_bytes: AtomicU64,
}

/// One decoded GOP: its frames' pts and pixels.
type Gop = Arc<Vec<(i64, Vec<u8>)>>;
/// A read waiting for a GOP: the made file, the range, the answer.
type Waiter = (u32, u64, u32, Reply);

#[derive(Default)]
struct Cache {
    gops: HashMap<(u32, u32), (Gop, u64)>,
    /// Use counter, for least-recently-used eviction.
    tick: u64,
    bytes: u64,
    /// GOPs being decoded, with the reads waiting for them.
    flight: HashMap<(u32, u32), Vec<Waiter>>,
    /// GOPs already logged as failed.
    failed: std::collections::HashSet<(u32, u32)>,
    /// Frames (video, pts) already logged as missing from their decoded GOP.
    missing: std::collections::HashSet<(u32, i64)>,
    /// Per video, the GOPs of its last few misses: a miss on the GOP after one of them is a
    /// reader walking the file in order, whose next GOP is decoded ahead.
    recent: HashMap<u32, [u32; 4]>,
}

/// The frames and made bytes of a mount's frame trees, decoded on demand.
pub struct FrameServer {
    made: Vec<Made>,
    videos: Vec<(PathBuf, VideoIndex)>,
    budget: u64,
    cache: Mutex<Cache>,
    pool: rayon::ThreadPool,
    /// Counters.
    pub stats: FrameStats,
    /// What the server's videos need while it serves (the local copies fetched for this
    /// mount of a prefix of loose objects, and their lock), dropped with it.
    held: Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>,
}

impl std::fmt::Debug for FrameServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameServer")
            .field("made", &self.made.len())
            .field("videos", &self.videos.len())
            .finish()
    }
}

impl FrameServer {
    /// Keeps `held` (e.g. the directory of local copies its videos are decoded from) until
    /// the server is dropped.
    pub fn keep(&self, held: Box<dyn std::any::Any + Send + Sync>) {
        (self.held.lock().unwrap_or_else(|p| p.into_inner())).push(held);
    }

    /// Serves `made` (indexed by a tree's made ids) from `videos` (path, index), keeping up
    /// to `budget` bytes of decoded GOPs, decoding on `threads` threads.
    ///
    /// Errors: the thread pool cannot start.
    pub fn new(
        made: Vec<Made>,
        videos: Vec<(PathBuf, VideoIndex)>,
        budget: u64,
        threads: usize,
    ) -> anyhow::Result<Arc<FrameServer>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("loosefs-frames-{i}"))
            .build()?;
        Ok(Arc::new(FrameServer {
            made,
            videos,
            budget,
            cache: Mutex::new(Cache::default()),
            pool,
            stats: FrameStats::default(),
            held: Mutex::new(Vec::new()),
        }))
    }

    /// Size of made file `id`, bytes.
    pub fn size(&self, id: u32) -> u64 {
        match self.made.get(id as usize) {
            Some(Made::Frame { video, kind, .. }) => {
                let ix = &self.videos[*video as usize].1;
                crate::view::size(*kind, ix.width, ix.height)
            }
            Some(Made::Bytes(b)) => b.len() as u64,
            Some(Made::Missing { size, .. }) => *size,
            None => 0,
        }
    }

    /// Answers a READ of `[offset, offset + size)` of made file `id`: at once from made bytes
    /// or the cache, else when its GOP is decoded (on a decode thread).
    pub fn read(self: &Arc<Self>, id: u32, offset: u64, size: u32, reply: Reply) {
        let (video, gop, pts) = match self.made.get(id as usize) {
            None => return reply(Err(FsError::NotFound)),
            Some(Made::Missing { why, .. }) => return reply(Err(FsError::Io(why.to_string()))),
            Some(_) if offset >= self.size(id) => return reply(Ok(&[])),
            Some(Made::Bytes(b)) => {
                let s = (offset as usize).min(b.len());
                let e = (offset as usize).saturating_add(size as usize).min(b.len());
                return reply(Ok(&b[s..e]));
            }
            Some(Made::Frame {
                video, gop, pts, ..
            }) => (*video, *gop, *pts),
        };
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.tick += 1;
        let tick = c.tick;
        // A cached part of a GOP too large for the cache may not hold this frame: a miss.
        if let Some((g, used)) =
            (c.gops.get_mut(&(video, gop))).filter(|(g, _)| g.iter().any(|f| f.0 == pts))
        {
            *used = tick;
            let g = g.clone();
            drop(c);
            self.stats.hits.fetch_add(1, Relaxed);
            return self.answer(id, &g, offset, size, reply);
        }
        if let Some(w) = c.flight.get_mut(&(video, gop)) {
            w.push((id, offset, size, reply));
            self.stats.joined.fetch_add(1, Relaxed);
            return;
        }
        c.flight
            .insert((video, gop), vec![(id, offset, size, reply)]);
        // In order: this GOP follows one missed lately (a shuffled reader's misses do not, and
        // decoding ahead for it would double the decode work).
        let recent = c.recent.entry(video).or_insert([u32::MAX; 4]);
        let in_order = gop > 0 && recent.contains(&(gop - 1));
        recent.rotate_left(1);
        recent[3] = gop;
        drop(c);
        self.stats.misses.fetch_add(1, Relaxed);
        self.decode(video, gop, in_order, Some(pts));
    }

    /// Decodes the GOP of made file `id` ahead of its reader (an announced order), unless it
    /// is cached (with that frame) or under way.
    pub fn prefetch(self: &Arc<Self>, id: u32) {
        let Some(Made::Frame {
            video, gop, pts, ..
        }) = self.made.get(id as usize)
        else {
            return;
        };
        let key = (*video, *gop);
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let cached = (c.gops.get(&key)).is_some_and(|(g, _)| g.iter().any(|f| f.0 == *pts));
        if cached || c.flight.contains_key(&key) {
            return;
        }
        c.flight.insert(key, Vec::new());
        drop(c);
        self.stats.ahead.fetch_add(1, Relaxed);
        self.decode(key.0, key.1, false, Some(*pts));
    }

    /// Frames of `video` a decode may keep: the budget shared by the decode threads, at least
    /// one frame.
    fn window(&self, video: u32) -> usize {
        let ix = &self.videos[video as usize].1;
        let frame = (ix.width as u64 * ix.height as u64 * 3).max(1);
        let share = self.budget / self.pool.current_num_threads().max(1) as u64;
        (share / frame).max(1) as usize
    }

    /// The frames to decode of GOP `gop` of `video` when all of them would not fit
    /// ([`FrameServer::window`]): the frames `asked` (the pts its readers wait for, and
    /// `from`), then the ones after the first of them, up to the window. `None`: the whole GOP.
    fn part(&self, video: u32, gop: u32, asked: &[i64]) -> Option<std::collections::HashSet<i64>> {
        let all = decoder::gop_pts(&self.videos[video as usize].1, gop as usize);
        let window = self.window(video);
        if all.len() <= window {
            return None;
        }
        let mut asked: Vec<i64> = asked.to_vec();
        asked.sort_unstable();
        asked.dedup();
        let mut part: std::collections::HashSet<i64> = asked.iter().take(window).copied().collect();
        let first = asked.first().copied().unwrap_or(all[0]);
        for p in all.iter().filter(|p| **p >= first) {
            if part.len() >= window {
                break;
            }
            part.insert(*p);
        }
        Some(part)
    }

    /// Decodes GOP `gop` of `video` on the pool (all of it, or the part its readers and
    /// `from` ask for when all would not fit), then answers its waiters (a waiter whose frame
    /// is outside the part decoded reads again, which decodes its own part); with `ahead`,
    /// then the next GOP of the file too, if it fits whole and is not cached or under way.
    fn decode(self: &Arc<Self>, video: u32, gop: u32, ahead: bool, from: Option<i64>) {
        let me = self.clone();
        self.pool.spawn(move || {
            let (path, ix) = &me.videos[video as usize];
            let asked: Vec<i64> = {
                let c = me.cache.lock().unwrap_or_else(|p| p.into_inner());
                (c.flight.get(&(video, gop)).into_iter().flatten())
                    .filter_map(|w| match me.made.get(w.0 as usize) {
                        Some(Made::Frame { pts, .. }) => Some(*pts),
                        _ => None,
                    })
                    .chain(from)
                    .collect()
            };
            let part = me.part(video, gop, &asked);
            let out = decoder::decode_gop(path, ix, gop as usize, part.as_ref());
            let mut c = me.cache.lock().unwrap_or_else(|p| p.into_inner());
            let waiters = c.flight.remove(&(video, gop)).unwrap_or_default();
            let g = match out {
                Ok(frames) => {
                    me.stats.gops.fetch_add(1, Relaxed);
                    me.stats.frames.fetch_add(frames.len() as u64, Relaxed);
                    let bytes: u64 = frames.iter().map(|f| f.1.len() as u64).sum();
                    let g: Gop = Arc::new(frames);
                    c.tick += 1;
                    let tick = c.tick;
                    if let Some((old, _)) = c.gops.insert((video, gop), (g.clone(), tick)) {
                        c.bytes -= old.iter().map(|f| f.1.len() as u64).sum::<u64>();
                    }
                    c.bytes += bytes;
                    me.evict(&mut c);
                    Ok(g)
                }
                Err(e) => {
                    me.stats.failures.fetch_add(1, Relaxed);
                    if c.failed.insert((video, gop)) {
                        log::error!("{}: GOP {gop} cannot be decoded: {e:#}", path.display());
                    }
                    Err(FsError::Io(format!(
                        "{}: GOP {gop} cannot be decoded: {e:#}",
                        path.display()
                    )))
                }
            };
            let next = (gop + 1, ahead && (gop as usize + 1) < ix.gops.len());
            let start_next = next.1
                && me.part(video, next.0, &[]).is_none()
                && !c.gops.contains_key(&(video, next.0))
                && !c.flight.contains_key(&(video, next.0));
            if start_next {
                c.flight.insert((video, next.0), Vec::new());
            }
            drop(c);
            for (id, offset, size, reply) in waiters {
                // Joined after the part was chosen, for a frame outside it: read again.
                let outside = match (&part, me.made.get(id as usize)) {
                    (Some(p), Some(Made::Frame { pts, .. })) => !p.contains(pts),
                    _ => false,
                };
                match &g {
                    Ok(_) if outside => me.read(id, offset, size, reply),
                    Ok(g) => me.answer(id, g, offset, size, reply),
                    Err(e) => reply(Err(e.clone())),
                }
            }
            if start_next {
                me.stats.ahead.fetch_add(1, Relaxed);
                me.decode(video, next.0, false, None);
            }
        });
    }

    /// Drops least recently used GOPs until the cache is within its budget (the newest is
    /// kept even alone over it: its readers are being answered from it).
    fn evict(&self, c: &mut Cache) {
        while c.bytes > self.budget && c.gops.len() > 1 {
            let Some((&k, _)) = c.gops.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((g, _)) = c.gops.remove(&k) {
                c.bytes -= g.iter().map(|f| f.1.len() as u64).sum::<u64>();
            }
        }
        self.stats.cached_bytes.store(c.bytes, Relaxed);
    }

    /// Bytes `[offset, offset + size)` of made file `id` (a frame) from its decoded GOP `g`.
    fn answer(&self, id: u32, g: &Gop, offset: u64, size: u32, reply: Reply) {
        let Some(Made::Frame {
            video, pts, kind, ..
        }) = self.made.get(id as usize)
        else {
            return reply(Err(FsError::NotFound));
        };
        let ix = &self.videos[*video as usize].1;
        let Some((_, px)) = g.iter().find(|f| f.0 == *pts) else {
            let why = format!(
                "{}: the frame at {:.6} s was not decoded from its GOP",
                self.videos[*video as usize].0.display(),
                ix.seconds(*pts)
            );
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if c.missing.insert((*video, *pts)) {
                log::error!("{why}: its views answer EIO");
            }
            drop(c);
            return reply(Err(FsError::Io(why)));
        };
        let h = header(*kind, ix.width, ix.height);
        let hl = h.len() as u64;
        let end = offset
            .saturating_add(u64::from(size))
            .min(hl + px.len() as u64);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        if offset < hl {
            out.extend_from_slice(&h[offset as usize..end.min(hl) as usize]);
        }
        if end > hl {
            out.extend_from_slice(&px[(offset.max(hl) - hl) as usize..(end - hl) as usize]);
        }
        reply(Ok(&out))
    }

    /// The `frames` section of the stats report.
    pub fn report(&self) -> crate::report::FramesReport {
        let s = &self.stats;
        crate::report::FramesReport {
            gops: s.gops.load(Relaxed),
            frames: s.frames.load(Relaxed),
            failures: s.failures.load(Relaxed),
            hits: s.hits.load(Relaxed),
            misses: s.misses.load(Relaxed),
            joined: s.joined.load(Relaxed),
            ahead: s.ahead.load(Relaxed),
            cached_bytes: s.cached_bytes.load(Relaxed),
            budget_bytes: self.budget,
            threads: self.pool.current_num_threads() as u64,
        }
    }

    /// Empties the GOP cache (`drop-cache`); GOPs being decoded finish and are kept.
    pub fn drop_cache(&self) -> u64 {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let freed = c.bytes;
        c.gops.clear();
        c.bytes = 0;
        self.stats.cached_bytes.store(0, Relaxed);
        freed
    }
}
