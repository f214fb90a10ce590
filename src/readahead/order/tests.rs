use super::merge;

#[test]
fn ranges_are_sorted_into_storage_order_and_merged_where_they_share_a_page() {
    let got = merge(vec![
        (0, 9000..9100),
        (1, 0..10),
        (0, 0..100),
        (0, 5000..8192),
        (0, 4000..4096),
        (0, 8192..8300),
        (0, 20_000..20_100),
    ]);
    assert_eq!(
        got,
        vec![
            (0, 0..4096),
            (0, 5000..9100),
            (0, 20_000..20_100),
            (1, 0..10),
        ]
    );
}

#[test]
fn ranges_a_page_apart_stay_apart() {
    // 100 ends in page 0 and 4096 starts page 1: merged (page 1 follows page 0 on the device).
    assert_eq!(
        merge(vec![(0, 4096..5000), (0, 0..100)]),
        vec![(0, 0..5000)]
    );
    assert_eq!(
        merge(vec![(0, 8192..9000), (0, 0..100)]),
        vec![(0, 0..100), (0, 8192..9000)]
    );
}
