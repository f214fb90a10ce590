//! JPEG header probe used at pack time: width, height and colour components from the SOF
//! marker (ITU-T T.81 B.2.2), read with zune-jpeg's header decoder without decoding pixels.
//! Decoded views need these to give exact file sizes at `stat` time.

use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;

/// Dimensions of a JPEG from its frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Colour components in the frame: 1 (grey), 3 (YCbCr or RGB) or 4 (CMYK/YCCK).
    pub components: u8,
}

/// Reads the frame header of `data` when it starts with a JPEG SOI marker and the header
/// decodes; `None` for anything else (non-JPEG files, damaged headers).
pub fn probe(data: &[u8]) -> Option<JpegInfo> {
    if data.len() < 4 || data[..3] != [0xFF, 0xD8, 0xFF] {
        return None;
    }
    let mut dec = JpegDecoder::new(ZCursor::new(data));
    dec.decode_headers().ok()?;
    let info = dec.info()?;
    if info.width == 0 || info.height == 0 || info.components == 0 {
        return None;
    }
    Some(JpegInfo {
        width: u32::from(info.width),
        height: u32::from(info.height),
        components: info.components,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_jpeg_is_none() {
        assert_eq!(probe(b""), None);
        assert_eq!(probe(b"\x89PNG\r\n\x1a\n...."), None);
        assert_eq!(probe(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0]), None);
    }
}
