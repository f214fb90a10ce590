//! Video files through FFmpeg's libraries (`ffmpeg-next` over libavformat, libavcodec and
//! libswscale; Debian 12's FFmpeg 5.1 decodes AV1 through libdav1d, H.264 and HEVC itself).
//!
//! A file is indexed once without decoding ([`VideoIndex::of`]): every packet of its video
//! stream is read (demuxed, not decoded) for its presentation timestamp and keyframe flag, so
//! the frames a file holds and the GOP each lies in are known before any pixel is. A GOP is
//! the run of packets in decode order from one keyframe up to the next; it decodes alone
//! ([`decode_gop`]: a seek to its keyframe, its packets, the decoder drained), which is how a
//! frame is served: its GOP decoded once, every frame of it kept.
//!
//! Pixels are RGB24, converted by libswscale with bilinear filtering, as PyAV's
//! `frame.to_ndarray(format="rgb24")` converts them (lerobot's pyav backend).

use anyhow::{Context, Result, anyhow, bail};
use ffmpeg_next as ff;
use std::ops::Range;
use std::path::Path;

/// One packet of the video stream, in decode order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Presentation timestamp, in the stream's time base (the decoded frame's).
    pub pts: i64,
    /// Starts a GOP (a keyframe).
    pub key: bool,
}

/// What a video file holds, known without decoding.
#[derive(Debug, Clone)]
pub struct VideoIndex {
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// The stream's time base: a timestamp `t` is `t × num / den` seconds.
    pub time_base: (i32, i32),
    /// Every packet of the video stream, in decode order.
    pub packets: Vec<Packet>,
    /// The GOPs: ranges of [`Self::packets`], each starting at a keyframe.
    pub gops: Vec<Range<usize>>,
}

/// Starts FFmpeg's libraries once (idempotent) and quiets their log to errors.
fn init() -> Result<()> {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let _ = ff::init();
        ff::util::log::set_level(ff::util::log::Level::Fatal);
    });
    Ok(())
}

impl VideoIndex {
    /// Indexes the video file `path`: its first video stream's size, time base and packets.
    ///
    /// Errors: not a container FFmpeg reads, no video stream, a packet without a timestamp,
    /// no keyframe first.
    pub fn of(path: &Path) -> Result<VideoIndex> {
        init()?;
        let name = path.display();
        let mut input = ff::format::input(&path)
            .with_context(|| format!("{name}: not a video FFmpeg reads"))?;
        let stream = (input.streams().best(ff::media::Type::Video))
            .ok_or_else(|| anyhow!("{name}: no video stream"))?;
        let at = stream.index();
        let tb = stream.time_base();
        let params = stream.parameters();
        let ctx = ff::codec::context::Context::from_parameters(params)
            .with_context(|| format!("{name}: cannot read its stream parameters"))?;
        let dec = ctx
            .decoder()
            .video()
            .with_context(|| format!("{name}: no decoder for its video stream"))?;
        let (width, height) = (dec.width(), dec.height());
        if width == 0 || height == 0 {
            bail!("{name}: the video stream gives no frame size");
        }
        let mut packets = Vec::new();
        for (s, p) in input.packets() {
            if s.index() != at {
                continue;
            }
            let pts = (p.pts().or(p.dts()))
                .ok_or_else(|| anyhow!("{name}: packet {} has no timestamp", packets.len()))?;
            packets.push(Packet {
                pts,
                key: p.is_key(),
            });
        }
        let starts: Vec<usize> = (packets.iter().enumerate())
            .filter(|(_, p)| p.key)
            .map(|(i, _)| i)
            .collect();
        if starts.first() != Some(&0) {
            bail!("{name}: the video does not start with a keyframe");
        }
        let gops = (starts.iter().enumerate())
            .map(|(g, &s)| s..starts.get(g + 1).copied().unwrap_or(packets.len()))
            .collect();
        Ok(VideoIndex {
            width,
            height,
            time_base: (tb.numerator(), tb.denominator()),
            packets,
            gops,
        })
    }

    /// A file known to hold no frames (one that could not be indexed).
    pub fn empty() -> VideoIndex {
        VideoIndex {
            width: 0,
            height: 0,
            time_base: (1, 1),
            packets: Vec::new(),
            gops: Vec::new(),
        }
    }

    /// Every frame as (its GOP, its pts), in presentation order (by pts; a pts given twice
    /// counts once, in its first GOP).
    pub fn frames(&self) -> Vec<(usize, i64)> {
        let mut out: Vec<(usize, i64)> = (self.gops.iter().enumerate())
            .flat_map(|(g, r)| self.packets[r.clone()].iter().map(move |p| (g, p.pts)))
            .collect();
        out.sort_by_key(|&(g, pts)| (pts, g));
        out.dedup_by_key(|f| f.1);
        out
    }

    /// Seconds of timestamp `pts`.
    pub fn seconds(&self, pts: i64) -> f64 {
        pts as f64 * f64::from(self.time_base.0) / f64::from(self.time_base.1)
    }

    /// The frame whose timestamp is nearest `t` seconds, as (its GOP, its pts, how far from
    /// `t` in seconds); `None` for a file with no frames. The first of equally near frames
    /// wins (as `argmin` does in lerobot's frame selection).
    pub fn nearest(&self, t: f64) -> Option<(usize, i64, f64)> {
        let mut best: Option<(usize, i64, f64)> = None;
        for (g, r) in self.gops.iter().enumerate() {
            for p in &self.packets[r.clone()] {
                let d = (self.seconds(p.pts) - t).abs();
                if best.is_none_or(|(_, q, bd)| d < bd || (d == bd && p.pts < q)) {
                    best = Some((g, p.pts, d));
                }
            }
        }
        best
    }
}

/// The frames of GOP `gop` of the file `path` (indexed as `index`), decoded: each frame's
/// pts and its RGB24 pixels (`height` × `width` × 3, rows top first), in presentation order;
/// with `only`, just the frames of those pts (a GOP too large for the cache is decoded to the
/// frames asked, the rest decoded and dropped: memory bounded by `only`'s frames).
///
/// Errors: the file cannot be opened or read, a packet does not decode (a damaged GOP), a
/// frame of another size than the index says.
pub fn decode_gop(
    path: &Path,
    index: &VideoIndex,
    gop: usize,
    only: Option<&std::collections::HashSet<i64>>,
) -> Result<Vec<(i64, Vec<u8>)>> {
    let r = (index.gops.get(gop).cloned())
        .ok_or_else(|| anyhow!("{}: no GOP {gop}", path.display()))?;
    let mut wanted: std::collections::HashSet<i64> =
        index.packets[r.clone()].iter().map(|p| p.pts).collect();
    if let Some(only) = only {
        wanted.retain(|p| only.contains(p));
    }
    let out = decode_from(path, index, gop, r.end, &wanted)?;
    if out.len() == wanted.len() || gop == 0 {
        return Ok(out);
    }
    // An open GOP (HEVC's CRA): its leading frames reference the GOP before, and a decoder
    // that starts at its keyframe drops them. Decoded from the GOP before instead.
    decode_from(path, index, gop - 1, r.end, &wanted)
}

/// The pts of GOP `gop`'s frames, in presentation order.
pub fn gop_pts(index: &VideoIndex, gop: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (index.gops.get(gop).cloned())
        .map(|r| index.packets[r].iter().map(|p| p.pts).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v.dedup();
    v
}

/// An open video file: its demuxer, its video stream's decoder and the RGB converter, kept
/// open by each decode thread for the files it decoded last (opening an MP4 parses its whole
/// sample table: for a file of 10,000 frames, more than decoding a GOP of 2 frames).
struct Session {
    input: ff::format::context::Input,
    at: usize,
    dec: ff::decoder::Video,
    scaler: ff::software::scaling::Context,
}

/// Open files kept per decode thread.
const SESSIONS_PER_THREAD: usize = 4;

thread_local! {
    /// This thread's open files, most recently used last.
    static SESSIONS: std::cell::RefCell<Vec<(std::path::PathBuf, Session)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Session {
    fn open(path: &Path, index: &VideoIndex) -> Result<Session> {
        init()?;
        let name = path.display();
        let input = ff::format::input(&path).with_context(|| format!("cannot open {name}"))?;
        let stream = (input.streams().best(ff::media::Type::Video))
            .ok_or_else(|| anyhow!("{name}: no video stream"))?;
        let at = stream.index();
        let ctx = ff::codec::context::Context::from_parameters(stream.parameters())?;
        let dec = ctx.decoder().video()?;
        let scaler = ff::software::scaling::Context::get(
            dec.format(),
            index.width,
            index.height,
            ff::format::Pixel::RGB24,
            index.width,
            index.height,
            ff::software::scaling::Flags::BILINEAR,
        )
        .with_context(|| format!("{name}: cannot convert its pixels to RGB"))?;
        Ok(Session {
            input,
            at,
            dec,
            scaler,
        })
    }
}

/// Runs `f` on this thread's open session of `path`, opening it if needed. A session whose
/// use failed is closed (its state is unknown).
fn with_session<T>(
    path: &Path,
    index: &VideoIndex,
    f: impl FnOnce(&mut Session) -> Result<T>,
) -> Result<T> {
    SESSIONS.with_borrow_mut(|v| {
        let (p, mut s) = match v.iter().position(|(p, _)| p == path) {
            Some(i) => v.remove(i),
            None => (path.to_path_buf(), Session::open(path, index)?),
        };
        let r = f(&mut s);
        if r.is_ok() {
            v.push((p, s));
            if v.len() > SESSIONS_PER_THREAD {
                v.remove(0);
            }
        }
        r
    })
}

/// The frames of `wanted` (pts) among the packets from GOP `gop`'s keyframe up to packet
/// `end` (exclusive, decode order), decoded and converted, in presentation order.
fn decode_from(
    path: &Path,
    index: &VideoIndex,
    gop: usize,
    end: usize,
    wanted: &std::collections::HashSet<i64>,
) -> Result<Vec<(i64, Vec<u8>)>> {
    with_session(path, index, |s| decode_in(s, path, index, gop, end, wanted))
}

/// [`decode_from`] in the open session `s`: a seek to the keyframe, the decoder flushed, the
/// packets sent, the decoder drained and flushed again for the next use.
fn decode_in(
    s: &mut Session,
    path: &Path,
    index: &VideoIndex,
    gop: usize,
    end: usize,
    wanted: &std::collections::HashSet<i64>,
) -> Result<Vec<(i64, Vec<u8>)>> {
    let name = path.display();
    let r = index.gops[gop].start..end;
    let Session {
        input,
        at,
        dec,
        scaler,
    } = s;
    let at = *at;
    let key_pts = index.packets[r.start].pts;
    // Rescaled to the seek's unit (AV_TIME_BASE, µs) rounding down, then backward: lands on
    // this keyframe (or an earlier one: the packets before it are skipped below).
    let us = (index.seconds(key_pts) * 1e6).floor() as i64;
    input
        .seek(us, ..us + 1)
        .with_context(|| format!("{name}: cannot seek to GOP {gop}"))?;
    dec.flush();
    let mut out = Vec::with_capacity(r.len());
    let mut frame = ff::frame::Video::empty();
    let mut rgb = ff::frame::Video::empty();
    let mut take = |dec: &mut ff::decoder::Video, out: &mut Vec<(i64, Vec<u8>)>| -> Result<()> {
        while dec.receive_frame(&mut frame).is_ok() {
            let Some(pts) = frame.pts().or(frame.timestamp()) else {
                continue;
            };
            if !wanted.contains(&pts) {
                continue;
            }
            if frame.width() != index.width || frame.height() != index.height {
                bail!(
                    "{name}: a frame of {}x{} in a {}x{} video",
                    frame.width(),
                    frame.height(),
                    index.width,
                    index.height
                );
            }
            scaler.run(&frame, &mut rgb)?;
            let (w, h) = (index.width as usize * 3, index.height as usize);
            let stride = rgb.stride(0);
            let data = rgb.data(0);
            let mut px = Vec::with_capacity(w * h);
            for row in 0..h {
                px.extend_from_slice(&data[row * stride..row * stride + w]);
            }
            out.push((pts, px));
        }
        Ok(())
    };
    // The packets of this GOP in decode order: found by position after the keyframe, whose
    // pts identifies it.
    let mut started = false;
    let mut sent = 0;
    for (st, p) in input.packets() {
        if st.index() != at {
            continue;
        }
        let pts = p.pts().or(p.dts());
        if !started {
            if p.is_key() && pts == Some(key_pts) {
                started = true;
            } else {
                continue;
            }
        }
        if sent == r.len() {
            break;
        }
        dec.send_packet(&p)
            .with_context(|| format!("{name}: GOP {gop} does not decode"))?;
        sent += 1;
        take(dec, &mut out)?;
    }
    if !started {
        bail!("{name}: GOP {gop}'s keyframe was not found");
    }
    dec.send_eof()?;
    take(dec, &mut out)?;
    dec.flush();
    out.sort_by_key(|f| f.0);
    out.dedup_by_key(|f| f.0);
    Ok(out)
}
