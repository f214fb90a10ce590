//! The pack format: a standard ZIP64 archive whose members are STORED and aligned (512 bytes by
//! default, up to 32 KiB), plus
//! loosefs's own fixed-record index stored as one extra member.
//!
//! Design: everything a mount needs is reachable in O(1) from the end of the file. The zip
//! archive comment (the last bytes of the file) holds a fixed-size [`trailer`] pointing at the
//! index member; the index is a 128-byte header followed by 64-byte records and a names blob
//! ([`index`]), checked with one xxh3-64 hash and then used in place through a memory map, so
//! mount time does not grow with the number of samples. Zip tools see an ordinary archive;
//! loosefs never parses the central directory. The byte layout is documented in `docs/PACK-FORMAT.md`.

pub mod index;
pub mod jpeg;
pub mod reader;
pub mod trailer;
pub mod writer;

/// Name of the zip member holding the loosefs index. A root-level dot-file, so ImageFolder and
/// DALI ignore it when the pack is extracted; the mount never shows it.
pub const INDEX_MEMBER: &str = ".loosefs-index";

/// Default alignment of every member's data, in bytes (one disk sector). Chosen by measurement
/// (docs/DESIGN.md, "Caches"): against 4096 it reads 5% fewer bytes and runs 4–5% faster cold
/// on a bandwidth-bound disk and makes packs 5% smaller for ImageNet-sized JPEGs; 4096 lets
/// the release of served samples drop every page, where 512 keeps one shared page per sample.
pub const DEFAULT_ALIGN: u32 = 512;

/// Largest alignment the zip writer supports (its alignment field is a `u16`).
pub const MAX_ALIGN: u32 = 32768;

/// Errors found while opening or checking a pack. Each names what is wrong; the pack path is
/// added by the caller.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// No loosefs trailer where a pack has one; the string says what was found.
    #[error("not a loosefs pack: {0}")]
    NotAPack(String),
    /// An index version this build does not read.
    #[error("unsupported index version {found} (this loosefs reads version {supported})")]
    Version {
        /// The version the pack's trailer names.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The index's xxh3 checksum does not match its bytes.
    #[error(
        "index checksum mismatch (stored {stored:016x}, computed {computed:016x}): the index is corrupted"
    )]
    Checksum {
        /// The checksum the trailer records.
        stored: u64,
        /// The checksum of the index bytes as read.
        computed: u64,
    },
    /// The index's records do not form a valid tree or lie outside it; the string says where.
    #[error("corrupted index: {0}")]
    Corrupt(String),
    /// The file ends before a structure it declares; the string says which.
    #[error("truncated pack: {0}")]
    Truncated(String),
    /// A whole pack followed by this many more bytes (something was appended to the file).
    #[error(
        "{0} bytes were appended after the end of the pack (truncating the file by {0} bytes gives the pack back)"
    )]
    Appended(u64),
    /// Reading the file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
