//! Fuzz target: a compressed chunk's decompression against the length and CRC its container
//! declares (first byte: zstd or deflate; next 8: the declared length, up to 2^64−1; the rest:
//! the stream). A bomb or a lying length must be refused without allocating what it claims.
use std::sync::Arc;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        if data.len() < 9 {
            return;
        }
        let codec = if data[0] & 1 == 0 {
            loosefs::storage::chunks::Codec::Zstd
        } else {
            loosefs::storage::chunks::Codec::Deflate
        };
        let len = u64::from_le_bytes(data[1..9].try_into().unwrap());
        let mut f = tempfile::tempfile().expect("temp file");
        std::io::Write::write_all(&mut f, &data[9..]).expect("write");
        let c = loosefs::storage::chunks::Chunk {
            path: "fuzz.chunk".into(),
            file: loosefs::storage::chunks::ChunkFile::Local(Arc::new(f)),
            range: 0..(data.len() - 9) as u64,
            codec,
            len,
            crc32: None,
            parquet: None,
        };
        let _ = c.decompress();
    });
}
