//! Shared pieces of the fuzz targets: a walk over everything an index view exposes, so a
//! target exercises every accessor the daemon uses on a pack that passed validation.

use loosefs::format::index::IndexView;

/// Visits every record of `ix` depth first through `children`, looks each name up again
/// through `find_child` and `lower_bound`, as lookups and listings do. Bounded by the record
/// count: a validated tree has no cycle, and a bug that made one would show up as a hang.
pub fn walk(ix: &IndexView<'_>) -> usize {
    let Some(root) = ix.record(0) else { return 0 };
    let mut seen = 0usize;
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for i in ix.children(&d) {
            let Some(r) = ix.record(i) else { continue };
            seen += 1;
            assert!(seen <= ix.len() as usize, "a record was reached twice");
            let name = ix.name(&r);
            assert_eq!(ix.find_child(&d, name), Some(i), "lookup of a listed name");
            assert!(ix.lower_bound(&d, name) <= i);
            if r.is_dir {
                stack.push(r);
            }
        }
    }
    seen
}
