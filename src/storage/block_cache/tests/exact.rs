//! Exact ranges over a [`FakeObject`]: only the ranges' bytes received, reads served from
//! memory without a block, neighbours sharing a GET, a failed GET falling back to blocks, a
//! damaged range dropped by a refetch, ranges already cached asking nothing.

use super::*;

/// `n` ranges of `len` bytes, `stride` apart, from `first`.
fn spread(first: u64, n: u64, len: u64, stride: u64) -> Vec<Range<u64>> {
    (0..n)
        .map(|k| first + k * stride..first + k * stride + len)
        .collect()
}

#[test]
fn a_sparse_order_receives_its_ranges_bytes_and_its_reads_fetch_no_block() {
    let w = World::new(16);
    let c = w.open(16 * BLOCK);
    // One sample of 100 KB in every 800 KB: 1/8 of the object.
    let ranges = spread(5000, 20, 100_000, 800_000);
    let wanted: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    c.will_need_exact(0, &ranges);
    for r in &ranges {
        assert_eq!(
            w.read(&c, r.clone()).unwrap(),
            &w.data[r.start as usize..r.end as usize]
        );
        // The kernel reads the sample again in pieces: still no GET.
        let piece = r.start + 4096..r.start + 20_000;
        assert_eq!(
            w.read(&c, piece.clone()).unwrap(),
            &w.data[piece.start as usize..piece.end as usize]
        );
    }
    let st = c.remote_report().unwrap();
    assert_eq!(c.counters().0, 0, "no block fetched");
    assert_eq!(st.bytes_received, wanted, "{st:?}");
    assert_eq!((st.exact_gets, st.exact_bytes_received), (20, wanted));
    assert!(st.exact_bytes_served >= wanted);
    assert!(st.exact_held_bytes <= HELD_MAX);
}

#[test]
fn neighbours_within_the_gap_share_one_get_and_bytes_between_are_the_only_extra() {
    let w = World::new(4);
    let c = w.open(4 * BLOCK);
    let ranges = spread(0, 10, 50_000, 50_000 + 1000);
    c.will_need_exact(0, &ranges);
    for r in &ranges {
        assert_eq!(
            w.read(&c, r.clone()).unwrap(),
            &w.data[r.start as usize..r.end as usize]
        );
    }
    let st = c.remote_report().unwrap();
    assert_eq!(st.exact_gets, 1, "{st:?}");
    assert_eq!(st.bytes_received, 10 * 50_000 + 9 * 1000);
}

#[test]
fn a_failed_exact_get_falls_back_to_the_blocks_and_bytes_stay_right() {
    let w = World::new(4);
    let c = w.open(4 * BLOCK);
    w.fake.fail_next.store(1, SeqCst);
    let r = 2 * BLOCK + 10..2 * BLOCK + 90_000;
    c.will_need_exact(0, std::slice::from_ref(&r));
    assert_eq!(
        w.read(&c, r.clone()).unwrap(),
        &w.data[r.start as usize..r.end as usize]
    );
    let st = c.remote_report().unwrap();
    assert_eq!(
        st.exact_held_bytes, 0,
        "the failed entry is dropped: {st:?}"
    );
    assert!(c.counters().0 >= 1, "the read fetched its block");
}

#[test]
fn damaged_exact_bytes_are_dropped_by_a_refetch() {
    let w = World::new(4);
    let c = w.open(4 * BLOCK);
    let r = BLOCK + 100..BLOCK + 60_000;
    w.fake.flip.store(true, SeqCst);
    c.will_need_exact(0, std::slice::from_ref(&r));
    let got = w.read(&c, r.clone()).unwrap();
    assert_ne!(
        got,
        &w.data[r.start as usize..r.end as usize],
        "the fake flipped a byte"
    );
    w.fake.flip.store(false, SeqCst);
    assert!(c.refetch(0, &r, c.generation()));
    assert_eq!(
        w.read(&c, r.clone()).unwrap(),
        &w.data[r.start as usize..r.end as usize]
    );
}

#[test]
fn ranges_in_cached_blocks_ask_nothing_and_overlapping_ranges_are_served_whole() {
    let w = World::new(4);
    let c = w.open(4 * BLOCK);
    w.read(&c, 0..10).unwrap();
    let gets = w.gets();
    c.will_need_exact(0, std::slice::from_ref(&(100..50_000)));
    assert_eq!(w.gets(), gets, "block 0 is cached");
    // Two samples sharing a page, asked in two batches: both served from memory.
    let (a, b) = (
        2 * BLOCK..2 * BLOCK + 6000,
        2 * BLOCK + 6000..2 * BLOCK + 20_000,
    );
    c.will_need_exact(0, std::slice::from_ref(&a));
    c.will_need_exact(0, std::slice::from_ref(&b));
    for r in [a, b] {
        assert_eq!(
            w.read(&c, r.clone()).unwrap(),
            &w.data[r.start as usize..r.end as usize]
        );
    }
    assert_eq!(c.counters().0, 1, "only block 0 was fetched as a block");
}
