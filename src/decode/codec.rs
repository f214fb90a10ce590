//! JPEG → RGB pixels. libjpeg-turbo 3 through the `turbojpeg` crate does the work, with one
//! `Decompressor` per thread (it is `Send`, not `Sync`) and its defaults: accurate integer
//! IDCT and fancy upsampling, the settings Pillow uses, so pixels equal
//! `Image.open(x).convert('RGB')`. Grayscale comes out as RGB (each value repeated).
//!
//! TurboJPEG 3 reports libjpeg *warnings* (corrupt-data recoveries such as extraneous bytes
//! before a marker, a premature end of data) as failures although it has written every pixel.
//! [`decode_rgb`] keeps those pixels. [`decode_checked`], what the mount uses, follows Pillow's
//! defaults instead: extraneous bytes before a marker (common in ImageNet, harmless) keep the
//! pixels; a truncated or corrupt scan, which Pillow refuses ("image file is truncated",
//! "broken data stream"), is an error unless [`Policy::accept_damaged`] (Pillow's
//! `ImageFile.LOAD_TRUNCATED_IMAGES = True`). It also refuses, before allocating anything, an
//! image whose header claims far more pixels than its compressed size can hold.
//!
//! What turbojpeg rejects (CMYK/YCCK cannot be converted to RGB by it, some damaged files)
//! falls back to zune-jpeg, and a fallback at a reduced scale is box-filtered down to the size
//! turbojpeg would have produced, so a file's size never depends on which decoder ran.

use crate::view::scaled_dims;
use std::cell::RefCell;
use turbojpeg::{Decompressor, Image, PixelFormat, ScalingFactor};
use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

/// Largest decoded image served, bytes of RGB pixels (a 16384×10922 image): a header that
/// claims more (up to 65535×65535, 12 GiB) is refused before any allocation.
pub const MAX_DECODED_BYTES: u64 = 512 << 20;

/// Why a JPEG could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Both decoders failed.
    #[error("cannot decode JPEG: turbojpeg: {turbo}; zune-jpeg: {fallback}")]
    Failed {
        /// turbojpeg's message.
        turbo: String,
        /// zune-jpeg's message.
        fallback: String,
    },
    /// libjpeg recovered from damage (a truncated or corrupt scan): the pixels are partly
    /// invented, so they are not served unless [`Policy::accept_damaged`].
    #[error(
        "damaged JPEG ({warning}); Pillow refuses it too (serve libjpeg's recovery with --decode-accept-damaged)"
    )]
    Damaged {
        /// libjpeg's warning.
        warning: String,
    },
    /// The header claims more pixels than the policy allows for a file of this size.
    #[error("cannot decode JPEG: {width}x{height} RGB ({} MiB) from {jpeg_bytes} bytes of JPEG is over the limit of {} MiB for it (a forged or broken header?)", (u64::from(*width) * u64::from(*height) * 3) >> 20, limit >> 20)]
    Oversized {
        /// Decoded width in pixels.
        width: u32,
        /// Decoded height in pixels.
        height: u32,
        /// Size of the JPEG, bytes.
        jpeg_bytes: u64,
        /// The limit for it, bytes of RGB.
        limit: u64,
    },
    /// The decoded image would exceed [`MAX_DECODED_BYTES`].
    #[error("cannot decode JPEG: {width}x{height} RGB is more than the {} MiB limit", MAX_DECODED_BYTES >> 20)]
    TooLarge {
        /// Decoded width in pixels.
        width: u32,
        /// Decoded height in pixels.
        height: u32,
    },
}

/// Decoded pixels: `height` rows of `width` RGB triples, row-major (HWC, uint8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub pixels: Vec<u8>,
    /// True when the fallback decoder produced the pixels.
    pub fallback: bool,
    /// The libjpeg warning turbojpeg reported while decoding, if any (pixels kept).
    pub warning: Option<String>,
}

/// Beginnings of libjpeg's warning messages (jerror.h, `JWRN_*`): the decode went on to the
/// end and the pixels are what libjpeg (and so Pillow) produces.
const WARNINGS: [&str; 6] = [
    "Corrupt JPEG data",
    "Premature end of JPEG file",
    "Warning: unknown JFIF revision",
    "Invalid SOS parameters for sequential JPEG",
    "Inconsistent progression sequence",
    "Application transferred too few scanlines",
];

fn is_warning(msg: &str) -> bool {
    let m = msg.strip_prefix("TurboJPEG error: ").unwrap_or(msg);
    WARNINGS.iter().any(|w| m.starts_with(w))
}

/// Whether a libjpeg warning is one Pillow decodes through with no error: bytes between the
/// end of a scan and the next marker (`JWRN_EXTRANEOUS_DATA`), the rest of the image intact.
fn is_benign(warning: &str) -> bool {
    warning.contains("extraneous bytes before marker")
}

/// Images at most this large decoded are never refused for their compression ratio, bytes.
pub const RATIO_FLOOR_BYTES: u64 = 64 << 20;
/// Decoded bytes allowed per byte of JPEG above [`RATIO_FLOOR_BYTES`]. A flat 4000x3000 image
/// compresses about 250:1; a forged header in a small file claims thousands to one.
pub const MAX_RATIO: u64 = 1024;

/// What [`decode_checked`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Serve libjpeg's recovery of a truncated or corrupt scan (grey where data is missing).
    pub accept_damaged: bool,
    /// Largest decoded image, bytes of RGB (at most [`MAX_DECODED_BYTES`]).
    pub max_bytes: u64,
}

/// [`decode_rgb`] under `policy`: refuses, before allocating, an image larger than
/// `policy.max_bytes` or than [`MAX_RATIO`] × the JPEG's size (above [`RATIO_FLOOR_BYTES`]),
/// and a damaged one unless `policy.accept_damaged`.
/// Errors: those of [`decode_rgb`], [`DecodeError::Oversized`], [`DecodeError::Damaged`].
pub fn decode_checked(
    jpeg: &[u8],
    denom: u32,
    width: u32,
    height: u32,
    policy: Policy,
) -> Result<Rgb, DecodeError> {
    let want = u64::from(width) * u64::from(height) * 3;
    let limit = policy.max_bytes.min(
        (jpeg.len() as u64)
            .saturating_mul(MAX_RATIO)
            .max(RATIO_FLOOR_BYTES),
    );
    if want > limit {
        return Err(DecodeError::Oversized {
            width,
            height,
            jpeg_bytes: jpeg.len() as u64,
            limit,
        });
    }
    let rgb = decode_rgb(jpeg, denom, width, height)?;
    match &rgb.warning {
        Some(w) if !is_benign(w) && !policy.accept_damaged => Err(DecodeError::Damaged {
            warning: w.strip_prefix("TurboJPEG error: ").unwrap_or(w).to_string(),
        }),
        _ => Ok(rgb),
    }
}

thread_local! {
    static TURBO: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

fn factor(denom: u32) -> ScalingFactor {
    match denom {
        2 => ScalingFactor::ONE_HALF,
        4 => ScalingFactor::ONE_QUARTER,
        8 => ScalingFactor::ONE_EIGHTH,
        _ => ScalingFactor::ONE,
    }
}

fn turbo(jpeg: &[u8], denom: u32, out: &mut [u8], w: u32, h: u32) -> Result<(), String> {
    TURBO.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| e.to_string())?);
        }
        let d = slot.as_mut().expect("just set");
        let header = d.read_header(jpeg).map_err(|e| e.to_string())?;
        let (sw, sh) = scaled_dims(header.width as u32, header.height as u32, denom);
        if (sw, sh) != (w, h) {
            return Err(format!(
                "frame is {}x{} (scaled {sw}x{sh}), the index says {w}x{h}",
                header.width, header.height
            ));
        }
        d.set_scaling_factor(factor(denom))
            .map_err(|e| e.to_string())?;
        let image = Image {
            pixels: out,
            width: w as usize,
            pitch: w as usize * 3,
            height: h as usize,
            format: PixelFormat::RGB,
        };
        d.decompress(jpeg, image).map_err(|e| e.to_string())
    })
}

fn zune(jpeg: &[u8], denom: u32, out: &mut [u8], w: u32, h: u32) -> Result<(), String> {
    let opts = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16);
    let mut dec = JpegDecoder::new_with_options(ZCursor::new(jpeg), opts);
    dec.decode_headers().map_err(|e| e.to_string())?;
    let (fw, fh) = dec.dimensions().ok_or("no dimensions")?;
    let (fw, fh) = (fw as u32, fh as u32);
    if scaled_dims(fw, fh, denom) != (w, h) {
        return Err(format!(
            "frame is {fw}x{fh}, the index says {w}x{h} at 1/{denom}"
        ));
    }
    let mut full = vec![0u8; dec.output_buffer_size().ok_or("size overflows")?];
    dec.decode_into(&mut full).map_err(|e| e.to_string())?;
    if full.len() != fw as usize * fh as usize * 3 {
        return Err(format!("decoded {} bytes for {fw}x{fh} RGB", full.len()));
    }
    if denom == 1 {
        out.copy_from_slice(&full);
    } else {
        box_downscale(&full, fw, fh, denom, out);
    }
    Ok(())
}

/// Averages `denom`×`denom` blocks of `src` (RGB, `sw`×`sh`) into `dst` (RGB,
/// `ceil(sw/denom)`×`ceil(sh/denom)`); edge blocks average the pixels they have.
fn box_downscale(src: &[u8], sw: u32, sh: u32, denom: u32, dst: &mut [u8]) {
    let (dw, dh) = scaled_dims(sw, sh, denom);
    let (sw, sh, denom) = (sw as usize, sh as usize, denom as usize);
    for y in 0..dh as usize {
        let rows = y * denom..((y + 1) * denom).min(sh);
        for x in 0..dw as usize {
            let cols = x * denom..((x + 1) * denom).min(sw);
            let n = (rows.len() * cols.len()) as u32;
            for c in 0..3 {
                let mut sum = 0u32;
                for sy in rows.clone() {
                    for sx in cols.clone() {
                        sum += u32::from(src[(sy * sw + sx) * 3 + c]);
                    }
                }
                dst[(y * dw as usize + x) * 3 + c] = ((sum + n / 2) / n) as u8;
            }
        }
    }
}

/// Decodes `jpeg` to RGB at 1/`denom` scale, expecting a frame whose scaled size is
/// `width`×`height` (from the index). turbojpeg first, zune-jpeg when turbojpeg fails.
/// Errors: both decoders failed, or the frame's size is not the one expected.
pub fn decode_rgb(jpeg: &[u8], denom: u32, width: u32, height: u32) -> Result<Rgb, DecodeError> {
    if u64::from(width) * u64::from(height) * 3 > MAX_DECODED_BYTES {
        return Err(DecodeError::TooLarge { width, height });
    }
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    let turbo_err = match turbo(jpeg, denom, &mut pixels, width, height) {
        Ok(()) => None,
        Err(e) if is_warning(&e) => Some(e),
        Err(e) => {
            return match zune(jpeg, denom, &mut pixels, width, height) {
                Ok(()) => Ok(Rgb {
                    width,
                    height,
                    pixels,
                    fallback: true,
                    warning: None,
                }),
                Err(fallback) => Err(DecodeError::Failed { turbo: e, fallback }),
            };
        }
    };
    Ok(Rgb {
        width,
        height,
        pixels,
        fallback: false,
        warning: turbo_err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_downscale_averages_blocks_and_edges() {
        // 3x1 image: two pixels in the first block, one in the edge block.
        let src = [0, 0, 0, 100, 50, 2, 7, 8, 9];
        let mut dst = [0u8; 6];
        box_downscale(&src, 3, 1, 2, &mut dst);
        assert_eq!(dst, [50, 25, 1, 7, 8, 9]);
    }

    #[test]
    fn forged_sizes_are_refused_before_allocating() {
        let policy = Policy {
            accept_damaged: false,
            max_bytes: MAX_DECODED_BYTES,
        };
        // A 100 KB file claiming 16000x10000 (480 MB of RGB): 4800 to one.
        let e = decode_checked(&vec![0u8; 100_000], 1, 16000, 10000, policy).unwrap_err();
        assert!(matches!(e, DecodeError::Oversized { .. }), "{e}");
        // The decode budget caps it too.
        let small = Policy {
            max_bytes: 1 << 20,
            ..policy
        };
        let e = decode_checked(&vec![0u8; 1 << 20], 1, 1000, 1000, small).unwrap_err();
        assert!(matches!(e, DecodeError::Oversized { .. }), "{e}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let e = decode_rgb(b"\xFF\xD8\xFF\xE0not a jpeg", 1, 4, 4).unwrap_err();
        assert!(matches!(e, DecodeError::Failed { .. }), "{e}");
        let e = decode_rgb(b"\xFF\xD8", 1, 65535, 65535).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot decode JPEG: 65535x65535 RGB is more than the 512 MiB limit"
        );
    }
}
