//! The `--decode*` options of `loosefs mount`: which decoded views a mount shows, and the
//! decoder's pool and cache.

use crate::decode::DecodeOptions;
use crate::memory::parse_size;
use crate::view::Views;
use anyhow::Result;
use clap::{Args, ValueEnum};

/// A decoded view (`--decode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ViewArg {
    /// `x.npy` beside every JPEG `x.JPEG`: NumPy .npy v1.0, uint8, shape (H, W, 3).
    Npy,
    /// `x.JPEG` itself serves a binary PPM (P6) of its RGB pixels.
    Ppm,
    /// A LeRobot v3 dataset's video frames: `frames/<camera>/episode_<N>/<frame>.npy|.ppm`,
    /// and its tabular columns per episode: `columns/episode_<N>/<feature>.npy`.
    Frames,
}

/// Decoded views of the JPEG samples.
#[derive(Args, Debug, Clone)]
pub struct DecodeArgs {
    /// Serve decoded views of every JPEG (`npy`, `ppm`, or both: `--decode npy,ppm`) and the
    /// frames of a LeRobot dataset's videos (`frames`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        help_heading = "Views (decoded JPEGs, video frames)",
        env = "LOOSEFS_DECODE"
    )]
    pub decode: Vec<ViewArg>,
    /// With `--decode npy`: list only the `.npy` views, not the JPEGs.
    #[arg(long, help_heading = "Views (decoded JPEGs, video frames)", env = "LOOSEFS_DECODED_ONLY", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub decoded_only: bool,
    /// Decode at the smallest DCT scale (1/2, 1/4, 1/8) whose longer side is still ≥ N pixels.
    #[arg(
        long,
        value_name = "N",
        help_heading = "Views (decoded JPEGs, video frames)",
        env = "LOOSEFS_DECODE_MAX_SIDE"
    )]
    pub decode_max_side: Option<u32>,
    /// Budget of the decoded cache (bytes of pixels, least recently used evicted), e.g. 2G
    /// [default: 1G; for video frames, half the memory available, at least 256M].
    #[arg(long, value_name = "SIZE", value_parser = parse_budget, help_heading = "Views (decoded JPEGs, video frames)", env = "LOOSEFS_DECODE_CACHE")]
    pub decode_cache: Option<u64>,
    /// Decode threads (default: one per core).
    #[arg(
        long,
        value_name = "N",
        help_heading = "Views (decoded JPEGs, video frames)",
        env = "LOOSEFS_DECODE_THREADS"
    )]
    pub decode_threads: Option<usize>,
    /// JPEGs decoded ahead of a reader that walks the pack in order (0 disables).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 8,
        help_heading = "Views (decoded JPEGs, video frames)",
        env = "LOOSEFS_DECODE_AHEAD"
    )]
    pub decode_ahead: usize,
    /// Serve what libjpeg recovers from truncated or corrupt JPEGs (grey where data is missing),
    /// as Pillow does with `ImageFile.LOAD_TRUNCATED_IMAGES = True`. By default their views
    /// answer EIO, as Pillow refuses them.
    #[arg(long, help_heading = "Views (decoded JPEGs, video frames)", env = "LOOSEFS_DECODE_ACCEPT_DAMAGED", value_name = "BOOL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", hide_default_value = true, hide_possible_values = true)]
    pub decode_accept_damaged: bool,
}

impl DecodeArgs {
    /// The views asked for. Errors: `--decoded-only` without `--decode npy`,
    /// `--decode-max-side` without a view, or a max side of 0.
    pub fn views(&self) -> Result<Views> {
        let v = Views {
            npy: self.decode.contains(&ViewArg::Npy),
            ppm: self.decode.contains(&ViewArg::Ppm),
            decoded_only: self.decoded_only,
            max_side: self.decode_max_side,
            frames: self.decode.contains(&ViewArg::Frames),
        };
        if v.decoded_only && !v.npy {
            anyhow::bail!(
                "--decoded-only needs --decode npy (a PPM view already replaces the JPEG)"
            );
        }
        if v.max_side.is_some() && !v.any() {
            anyhow::bail!("--decode-max-side needs --decode npy or --decode ppm");
        }
        if v.max_side == Some(0) {
            anyhow::bail!("--decode-max-side must be at least 1");
        }
        Ok(v)
    }

    /// The decoder's settings (threads default to one per core).
    pub fn options(&self) -> DecodeOptions {
        DecodeOptions {
            cache_bytes: self.decode_cache.unwrap_or(1 << 30),
            frame_cache_bytes: self.decode_cache.unwrap_or_else(frame_cache_default),
            threads: self
                .decode_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            ahead: self.decode_ahead,
            accept_damaged: self.decode_accept_damaged,
        }
    }
}

/// The decoded-GOP cache's budget when none is given: half the memory available to this
/// process (the lesser of `MemAvailable` and the room under its cgroup's limit) less
/// [`crate::memory::MEMORY_MARGIN`], at least 256 MiB (1 GiB where neither can be read).
/// Decoded frames are 20–100× their compressed size (a 240×320 AV1 frame: ~2 KB in the file,
/// 230 KB decoded), so the cache, not the page cache, is what makes a second epoch fast.
pub fn frame_cache_default() -> u64 {
    let avail = crate::memory::mem_available();
    let room = crate::memory::cgroup_room().map(|r| r.0);
    match avail.into_iter().chain(room).min() {
        Some(m) => (m / 2)
            .saturating_sub(crate::memory::MEMORY_MARGIN)
            .max(256 << 20),
        None => 1 << 30,
    }
}

fn parse_budget(s: &str) -> Result<u64, String> {
    parse_size(s)?.ok_or_else(|| "give a size such as 512M or 2G".into())
}
