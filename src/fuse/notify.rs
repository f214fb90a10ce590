//! `FUSE_NOTIFY_STORE` written on the connection's descriptor by loosefs itself: fuser's
//! `Notifier::store` reports the kernel's ENOENT (the kernel holds no inode of that number: a
//! file not looked up yet) as success, as it does for invalidations, where ENOENT is harmless.
//! For a store it is not: the sample would count as pushed while the kernel holds nothing, its
//! stored pages would be released, and its reader's READ would read it from the device again.
//!
//! Layout from `include/uapi/linux/fuse.h`: `fuse_out_header { len: u32, error: i32 (the
//! notify code), unique: u64 (0) }`, then `fuse_notify_store_out { nodeid: u64, offset: u64,
//! size: u32, padding: u32 }`, then the bytes.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;

/// `FUSE_NOTIFY_STORE` in `enum fuse_notify_code`.
const FUSE_NOTIFY_STORE: i32 = 4;
/// Bytes of `fuse_out_header` plus `fuse_notify_store_out`.
const HEAD: usize = 16 + 24;

/// The two headers of a store of `len` bytes at `offset` of inode `ino`, as the kernel reads
/// them (native byte order).
fn store_head(ino: u64, offset: u64, len: u32) -> [u8; HEAD] {
    let mut h = [0u8; HEAD];
    h[0..4].copy_from_slice(&(HEAD as u32 + len).to_ne_bytes());
    h[4..8].copy_from_slice(&FUSE_NOTIFY_STORE.to_ne_bytes());
    // unique (8..16) is 0 for a notification.
    h[16..24].copy_from_slice(&ino.to_ne_bytes());
    h[24..32].copy_from_slice(&offset.to_ne_bytes());
    h[32..36].copy_from_slice(&len.to_ne_bytes());
    h
}

/// Puts `data` into the kernel's page cache of inode `ino` from byte `offset` (growing its
/// cached size to cover it) through the FUSE connection `dev`.
///
/// Errors: `NotFound` when the kernel holds no such inode (it was never looked up, or was
/// forgotten); `InvalidInput` for more than `u32::MAX` bytes; any other error of the write.
pub fn store(dev: impl AsFd, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
    let len = u32::try_from(data.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let head = store_head(ino, offset, len);
    let n = nix::sys::uio::writev(dev, &[IoSlice::new(&head), IoSlice::new(data)])?;
    if n != HEAD + data.len() {
        return Err(io::Error::other(format!(
            "short notify write: {n} of {} bytes",
            HEAD + data.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_header_has_the_kernels_layout() {
        let h = store_head(0x0102_0304_0506_0708, 4096, 100);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().unwrap()), 140);
        assert_eq!(i32::from_ne_bytes(h[4..8].try_into().unwrap()), 4);
        assert_eq!(&h[8..16], &[0; 8]);
        assert_eq!(
            u64::from_ne_bytes(h[16..24].try_into().unwrap()),
            0x0102_0304_0506_0708
        );
        assert_eq!(u64::from_ne_bytes(h[24..32].try_into().unwrap()), 4096);
        assert_eq!(u32::from_ne_bytes(h[32..36].try_into().unwrap()), 100);
        assert_eq!(&h[36..40], &[0; 4]);
    }
}
