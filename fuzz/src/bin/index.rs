//! Fuzz target: index bytes (the `.loosefs-index` member). The checksum is recomputed over the
//! input first, so the fuzzer explores the structure a forger controls, not the hash.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        let mut bytes = data.to_vec();
        if bytes.len() >= 128 {
            let c = loosefs::pack::index::checksum(&bytes);
            bytes[120..128].copy_from_slice(&c.to_le_bytes());
        }
        let Ok(ix) = loosefs::pack::index::IndexView::parse(&bytes) else {
            return;
        };
        if ix.validate_tree().is_ok() {
            let n = loosefs_fuzz::walk(&ix);
            assert_eq!(
                n as u64 + 1,
                ix.totals().records,
                "every record reachable once"
            );
        }
    });
}
