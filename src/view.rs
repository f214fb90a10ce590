//! Geometry of decoded views (shared by the catalog, which sizes them, and the decoder, which
//! fills them): which views a mount serves, the DCT scale rule, names, and the byte layout.
//!
//! A view file is a small header followed by
//! the RGB pixels (HWC, uint8), so every size is known at `stat` time from the dimensions in
//! the index, and any byte range is a slice of the header or of the cached pixels.
//!
//! - `.npy`: NumPy format version 1.0 (numpy.lib.format): magic `\x93NUMPY`, version 1.0,
//!   little-endian u16 header length, a Python dict literal padded with spaces and ended by
//!   `\n` so that the data starts at a multiple of 64 bytes — byte-identical to `np.save` of a
//!   uint8 array of shape (H, W, 3).
//! - PPM: Netpbm binary `P6` (netpbm.sourceforge.net/doc/ppm.html): `P6\n<W> <H>\n255\n`.

/// Scale denominators turbojpeg can decode at in the DCT domain (1/1, 1/2, 1/4, 1/8).
pub const SCALES: [u32; 4] = [1, 2, 4, 8];

/// Size of an image `width`×`height` decoded at 1/`denom` scale, as libjpeg-turbo computes it
/// (`TJSCALED`: each side rounded up).
pub fn scaled_dims(width: u32, height: u32, denom: u32) -> (u32, u32) {
    (width.div_ceil(denom), height.div_ceil(denom))
}

/// The smallest scale denominator from [`SCALES`] whose scaled longer side is still ≥
/// `max_side` (1 when `max_side` is `None` or the image is already smaller).
pub fn pick_denom(width: u32, height: u32, max_side: Option<u32>) -> u32 {
    let Some(target) = max_side else { return 1 };
    let long = width.max(height);
    SCALES
        .iter()
        .rev()
        .copied()
        .find(|&d| long.div_ceil(d) >= target)
        .unwrap_or(1)
}

/// Shape of one decoded view of one JPEG: what the catalog records so that `stat` knows the
/// size and the decoder knows what to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewGeom {
    /// Format of the view file.
    pub kind: ViewKind,
    /// Decoded width in pixels (after scaling).
    pub width: u32,
    /// Decoded height in pixels (after scaling).
    pub height: u32,
    /// DCT scale denominator (1, 2, 4 or 8).
    pub denom: u32,
}

impl ViewGeom {
    /// The view of a `width`×`height` JPEG scaled by [`pick_denom`] for `max_side`.
    pub fn new(kind: ViewKind, width: u32, height: u32, max_side: Option<u32>) -> ViewGeom {
        let denom = pick_denom(width, height, max_side);
        let (width, height) = scaled_dims(width, height, denom);
        ViewGeom {
            kind,
            width,
            height,
            denom,
        }
    }

    /// The view file's header bytes.
    pub fn header(&self) -> Vec<u8> {
        header(self.kind, self.width, self.height)
    }

    /// The view file's size in bytes (header + pixels).
    pub fn size(&self) -> u64 {
        size(self.kind, self.width, self.height)
    }
}

/// Which decoded views a mount serves (`loosefs mount --decode …`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Views {
    /// `x.npy` beside every JPEG `x.JPEG`.
    pub npy: bool,
    /// The JPEG's own name serves a PPM of its pixels.
    pub ppm: bool,
    /// Hide the JPEG bytes: with `npy` alone, `x.JPEG` is not listed (only `x.npy`).
    pub decoded_only: bool,
    /// Decode at the smallest DCT scale whose longer side is still ≥ this, pixels.
    pub max_side: Option<u32>,
    /// Frames of the videos of a LeRobot v3 dataset (`frames/`, `columns/`: [`crate::video`]).
    pub frames: bool,
}

impl Views {
    /// True when any decoded view is served.
    pub fn any(&self) -> bool {
        self.npy || self.ppm
    }

    /// True when the original JPEG bytes are not reachable by name.
    pub fn hides_jpeg(&self) -> bool {
        self.decoded_only && self.npy && !self.ppm
    }
}

/// Format of one decoded view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewKind {
    /// NumPy .npy v1.0, uint8, shape (H, W, 3).
    Npy,
    /// Binary PPM (P6), RGB, maxval 255.
    Ppm,
}

/// Header of a view of a `width`×`height` RGB image.
pub fn header(kind: ViewKind, width: u32, height: u32) -> Vec<u8> {
    match kind {
        ViewKind::Ppm => format!("P6\n{width} {height}\n255\n").into_bytes(),
        ViewKind::Npy => npy_header("|u1", &format!("({height}, {width}, 3)")),
    }
}

/// A NumPy format 1.0 header (numpy.lib.format) for C-order data of type `descr` (`|u1`,
/// `<f4`) and shape `shape` (a Python tuple literal, `(H, W, 3)`): magic, version, u16 header
/// length, the dict padded with spaces and ended by `\n` so the data starts at a multiple of
/// 64 bytes, as `np.save` writes it.
pub fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // 10 bytes of preamble + dict + padding + '\n', a multiple of 64 in all.
    let total = (10 + dict.len() + 1).div_ceil(64) * 64;
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Size in bytes of a view of a `width`×`height` RGB image.
pub fn size(kind: ViewKind, width: u32, height: u32) -> u64 {
    header(kind, width, height).len() as u64 + u64::from(width) * u64::from(height) * 3
}

/// Copies bytes `[offset, offset+len)` of the view (header + `pixels`) into `out` (cleared
/// first); empty past the end.
pub fn slice_into(header: &[u8], pixels: &[u8], offset: u64, len: u32, out: &mut Vec<u8>) {
    out.clear();
    let total = (header.len() + pixels.len()) as u64;
    let start = offset.min(total) as usize;
    let end = offset.saturating_add(u64::from(len)).min(total) as usize;
    let h = header.len();
    if start < h {
        out.extend_from_slice(&header[start..end.min(h)]);
    }
    if end > h {
        out.extend_from_slice(&pixels[start.max(h) - h..end - h]);
    }
}

/// The name of the `.npy` view of a file named `name`: its extension (from the last `.`, if
/// any, not at the start) replaced by `.npy`.
pub fn npy_name(name: &[u8]) -> Vec<u8> {
    let mut n = stem(name).to_vec();
    n.extend_from_slice(b".npy");
    n
}

/// `name` without its extension.
pub fn stem(name: &[u8]) -> &[u8] {
    match name.iter().rposition(|&b| b == b'.') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denominators_keep_the_long_side_at_least_max_side() {
        assert_eq!(pick_denom(500, 375, None), 1);
        assert_eq!(pick_denom(500, 375, Some(256)), 1); // 250 < 256
        assert_eq!(pick_denom(500, 375, Some(250)), 2);
        assert_eq!(pick_denom(500, 375, Some(63)), 8); // ceil(500/8) = 63
        assert_eq!(pick_denom(500, 375, Some(64)), 4);
        assert_eq!(pick_denom(100, 80, Some(1000)), 1);
        assert_eq!(scaled_dims(501, 375, 2), (251, 188));
    }

    #[test]
    fn npy_header_is_what_numpy_writes() {
        // Bytes of np.save(f, np.zeros((375, 500, 3), np.uint8))[:128], numpy 2.x.
        let mut want = b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (375, 500, 3), }".to_vec();
        want.resize(127, b' ');
        want.push(b'\n');
        assert_eq!(header(ViewKind::Npy, 500, 375), want);
        assert_eq!(size(ViewKind::Npy, 500, 375), 128 + 500 * 375 * 3);
        assert_eq!(header(ViewKind::Ppm, 5, 3), b"P6\n5 3\n255\n");
    }

    #[test]
    fn slices_cross_the_header_boundary() {
        let mut out = Vec::new();
        slice_into(b"HDR", b"pixels", 1, 4, &mut out);
        assert_eq!(out, b"DRpi");
        slice_into(b"HDR", b"pixels", 3, 100, &mut out);
        assert_eq!(out, b"pixels");
        slice_into(b"HDR", b"pixels", 0, 2, &mut out);
        assert_eq!(out, b"HD");
        slice_into(b"HDR", b"pixels", 9, 2, &mut out);
        assert!(out.is_empty());
        slice_into(b"HDR", b"pixels", 50, 2, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn npy_names_replace_the_extension() {
        assert_eq!(npy_name(b"x.JPEG"), b"x.npy");
        assert_eq!(npy_name(b"a.b.jpg"), b"a.b.npy");
        assert_eq!(npy_name(b"noext"), b"noext.npy");
        assert_eq!(npy_name(b".hidden"), b".hidden.npy");
    }
}
