//! The block cache over a [`FakeObject`]: single flight, damaged blocks after a crash and
//! after a clean close, outages, a replaced object, eviction under readers, the size bound,
//! and a full disk.

mod exact;

use super::*;
use crate::storage::object::fake::FakeObject;
use std::sync::Barrier;
use std::sync::atomic::Ordering::SeqCst;

/// `n` bytes of a deterministic pattern (no two blocks alike).
fn pattern(n: u64) -> Vec<u8> {
    crate::testutil::noise(0x9e37_79b9_7f4a_7c15, n as usize)
}

struct World {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    data: Vec<u8>,
    fake: Arc<FakeObject>,
}

impl World {
    fn new(blocks: u64) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        check_root(&root).unwrap();
        let data = pattern(blocks * BLOCK - 1000);
        let fake = Arc::new(FakeObject::new("s3://b/k", data.clone()));
        World {
            _tmp: tmp,
            root,
            data,
            fake,
        }
    }

    fn dir(&self) -> std::path::PathBuf {
        self.root.join("obj")
    }

    fn open(&self, limit: u64) -> BlockCache {
        let d = CacheDir::lock(&self.dir()).unwrap();
        BlockCache::open(self.fake.clone(), d, limit).unwrap()
    }

    fn gets(&self) -> u64 {
        self.fake.stats().gets.load(SeqCst)
    }

    fn read(&self, c: &BlockCache, r: Range<u64>) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; (r.end - r.start) as usize];
        c.read_at(0, r.start, &mut buf)?;
        Ok(buf)
    }

    /// Flips one byte of block `b` in the cache file.
    fn damage(&self, b: u64) {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir().join("data"))
            .unwrap();
        let off = b * BLOCK + 777;
        let mut x = [0u8];
        f.read_exact_at(&mut x, off).unwrap();
        f.write_all_at(&[x[0] ^ 0x40], off).unwrap();
    }
}

#[test]
fn a_read_fetches_its_blocks_once_and_serves_the_objects_bytes() {
    let w = World::new(8);
    let c = w.open(64 << 20);
    let r = BLOCK - 10..3 * BLOCK + 5;
    assert_eq!(
        w.read(&c, r.clone()).unwrap(),
        &w.data[r.start as usize..r.end as usize]
    );
    assert_eq!(w.gets(), 1, "blocks 0..4 in one merged GET");
    assert_eq!(c.counters().0, 4);
    assert_eq!(w.read(&c, 0..100).unwrap(), &w.data[..100]);
    assert_eq!(w.gets(), 1, "cached");
    let end = w.data.len() as u64;
    assert!(w.read(&c, end - 1..end + 1).is_err(), "past the end");
}

#[test]
fn many_readers_of_one_missing_block_make_one_get() {
    let w = World::new(4);
    w.fake.stall_ms.store(50, SeqCst);
    let c = w.open(64 << 20);
    let go = Barrier::new(16);
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let (c, w, go) = (&c, &w, &go);
            s.spawn(move || {
                go.wait();
                let r = BLOCK + i * 1000..BLOCK + i * 1000 + 500;
                assert_eq!(
                    w.read(c, r.clone()).unwrap(),
                    &w.data[r.start as usize..r.end as usize]
                );
            });
        }
    });
    assert_eq!(w.gets(), 1);
}

#[test]
fn a_damaged_block_after_a_crash_is_counted_logged_and_fetched_once() {
    let w = World::new(8);
    {
        let c = w.open(64 << 20);
        w.read(&c, 0..w.data.len() as u64).unwrap();
        // Dropped without close: a crash (no clean marker).
    }
    w.damage(5);
    let before = w.gets();
    let c = w.open(64 << 20);
    assert_eq!(c.state(5), State::Unchecked);
    let go = Barrier::new(12);
    std::thread::scope(|s| {
        for i in 0..12u64 {
            let (c, w, go) = (&c, &w, &go);
            s.spawn(move || {
                go.wait();
                if i % 3 == 0 {
                    // Read-ahead's check of the same block, racing the readers.
                    c.will_need(0, &(4 * BLOCK..6 * BLOCK));
                }
                let r = 5 * BLOCK + i * 100..5 * BLOCK + i * 100 + 4096;
                assert_eq!(
                    w.read(c, r.clone()).unwrap(),
                    &w.data[r.start as usize..r.end as usize]
                );
            });
        }
    });
    assert_eq!(c.counters().2, 1, "one damaged block counted once");
    assert_eq!(w.gets() - before, 1, "fetched once");
    assert_eq!(c.state(5), State::Present);
}

#[test]
fn after_a_clean_close_the_table_is_trusted_and_refetch_repairs_a_sample() {
    let w = World::new(4);
    {
        let c = w.open(64 << 20);
        w.read(&c, 0..w.data.len() as u64).unwrap();
        c.close();
    }
    w.damage(2);
    let before = w.gets();
    let c = w.open(64 << 20);
    assert_eq!(c.state(2), State::Present, "trusted after a clean close");
    let r = 2 * BLOCK..2 * BLOCK + 4096;
    // The storage serves the damaged bytes (the read path's sample CRC catches them)...
    assert_ne!(
        w.read(&c, r.clone()).unwrap(),
        &w.data[r.start as usize..r.end as usize]
    );
    assert_eq!(w.gets(), before);
    // ...and a refetch under the generation the read saw repairs them, once.
    let g = c.generation();
    assert!(c.refetch(0, &r, g));
    assert!(
        c.refetch(0, &r, g),
        "a second refetch for the same generation is a no-op"
    );
    assert_eq!(w.gets() - before, 1);
    assert_eq!(
        w.read(&c, r.clone()).unwrap(),
        &w.data[r.start as usize..r.end as usize]
    );
    assert_ne!(c.generation(), g, "samples are checked again");
}

#[test]
fn an_outage_fails_reads_then_they_recover() {
    let w = World::new(4);
    let c = w.open(64 << 20);
    w.fake.down.store(true, SeqCst);
    let e = w.read(&c, 0..10).unwrap_err();
    assert!(e.to_string().contains("connection refused"), "{e}");
    assert_eq!(
        c.state(0),
        State::Missing,
        "a failed fetch leaves the block missing"
    );
    w.fake.down.store(false, SeqCst);
    assert_eq!(w.read(&c, 0..10).unwrap(), &w.data[..10]);
    // Transient failures: each read claims its blocks again, up to three fetches.
    w.fake.fail_next.store(2, SeqCst);
    assert!(
        w.read(&c, BLOCK..BLOCK + 10)
            .unwrap_err()
            .to_string()
            .contains("503")
    );
    assert!(
        w.read(&c, BLOCK..BLOCK + 10)
            .unwrap_err()
            .to_string()
            .contains("503")
    );
    assert_eq!(
        w.read(&c, BLOCK..BLOCK + 10).unwrap(),
        &w.data[BLOCK as usize..BLOCK as usize + 10]
    );
}

#[test]
fn a_replaced_object_fails_uncached_reads_and_cached_bytes_stay_the_mounted_version() {
    let w = World::new(4);
    let c = w.open(64 << 20);
    assert_eq!(w.read(&c, 0..10).unwrap(), &w.data[..10]);
    w.fake.replace(vec![7u8; w.data.len()]);
    let e = w.read(&c, 3 * BLOCK..3 * BLOCK + 10).unwrap_err();
    assert!(e.to_string().contains("replaced"), "{e}");
    // Its kind says so (the read path answers ESTALE from it, not EIO), and the typed error
    // rides inside.
    assert_eq!(e.kind(), std::io::ErrorKind::StaleNetworkFileHandle, "{e}");
    assert!(
        matches!(
            e.get_ref()
                .and_then(|i| i.downcast_ref::<crate::storage::object::source::ObjectError>()),
            Some(crate::storage::object::source::ObjectError::Replaced { .. })
        ),
        "{e:?}"
    );
    assert_eq!(
        w.read(&c, 0..10).unwrap(),
        &w.data[..10],
        "never mixed versions"
    );
}

#[test]
fn eviction_under_readers_keeps_bytes_right_and_the_cache_within_its_size() {
    let w = World::new(80);
    let c = w.open(MIN_CACHE);
    let n = w.data.len() as u64;
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let (c, w) = (&c, &w);
            s.spawn(move || {
                let mut x = t + 1;
                for _ in 0..150 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let start = (x >> 11) % (n - 300_000);
                    let r = start..start + 1 + (x >> 40) % 300_000;
                    assert_eq!(
                        w.read(c, r.clone()).unwrap(),
                        &w.data[r.start as usize..r.end as usize]
                    );
                }
            });
        }
    });
    assert!(c.counters().1 > 0, "something was evicted");
    assert!(c.cached_bytes() <= MIN_CACHE, "{} cached", c.cached_bytes());
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(w.dir().join("data")).unwrap().blocks() * 512;
    assert!(
        allocated <= MIN_CACHE + BLOCK,
        "{allocated} bytes allocated"
    );
}

#[test]
fn pinned_blocks_are_never_evicted_and_a_pin_over_the_cache_is_refused() {
    let w = World::new(40);
    let c = w.open(MIN_CACHE);
    c.pin(0, &(0..4 * BLOCK)).unwrap();
    let n = w.data.len() as u64;
    w.read(&c, 4 * BLOCK..n).unwrap();
    for b in 0..4 {
        assert_eq!(c.state(b), State::Present);
    }
    let e = c.pin(0, &(0..n)).unwrap_err();
    assert!(e.to_string().contains("--cache-size"), "{e}");
}

#[test]
#[ignore = "needs root: mounts a 40 MiB tmpfs as a full cache disk"]
fn a_full_cache_disk_serves_from_memory_and_shrinks_the_cache() {
    let w = World::new(48);
    let small = crate::testutil::SmallTmpfs::mount(w._tmp.path(), "small", "40m");
    let fs = small.path();
    // Another process fills most of the disk after the mount: 24 MiB left for the cache.
    std::fs::write(fs.join("ballast"), vec![1u8; 16 << 20]).unwrap();
    let d = CacheDir::lock(&fs.join("obj")).unwrap();
    let c = BlockCache::open(w.fake.clone(), d, 1 << 30).unwrap();
    let n = w.data.len() as u64;
    for pass in 0..2 {
        let mut off = 0;
        while off < n {
            let e = (off + 300_000).min(n);
            assert_eq!(
                w.read(&c, off..e).unwrap(),
                &w.data[off as usize..e as usize],
                "pass {pass} at {off}"
            );
            off = e;
        }
    }
    assert!(
        c.limit() < 40 << 20,
        "the cache shrank to the disk: {}",
        c.limit()
    );
    let received = w.fake.stats().bytes.load(SeqCst);
    assert!(
        received <= 2 * n + n / 5,
        "two passes received {received} bytes for {n}"
    );
}

#[test]
fn drop_cache_evicts_pages_but_keeps_the_blocks() {
    let w = World::new(4);
    let c = w.open(64 << 20);
    let n = w.data.len() as u64;
    w.read(&c, 0..n).unwrap();
    let gets = w.gets();
    c.evict(0, &(0..n)).unwrap();
    for b in 0..4 {
        assert_eq!(c.state(b), State::Present);
    }
    assert_eq!(w.read(&c, 0..n).unwrap(), w.data);
    assert_eq!(w.gets(), gets, "no block fetched again");
}

#[test]
fn a_data_file_cut_short_after_a_clean_close_is_checked_and_each_lost_block_fetched_once() {
    let w = World::new(8);
    {
        let c = w.open(64 << 20);
        w.read(&c, 0..w.data.len() as u64).unwrap();
        c.close();
    }
    // The last three blocks and part of a fourth lost (a full disk, a careless copy).
    let keep = 4 * BLOCK + 100;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(w.dir().join("data"))
        .unwrap();
    f.set_len(keep).unwrap();
    drop(f);
    let (gets, bytes) = (w.gets(), w.fake.stats().bytes.load(SeqCst));
    let c = w.open(64 << 20);
    assert_eq!(
        c.state(0),
        State::Unchecked,
        "not trusted: the file changed length"
    );
    for _ in 0..2 {
        assert_eq!(w.read(&c, 0..w.data.len() as u64).unwrap(), w.data);
    }
    let lost = 8 - 4;
    let got = w.fake.stats().bytes.load(SeqCst) - bytes;
    assert!(w.gets() > gets, "the lost blocks were fetched");
    assert!(
        got <= lost * BLOCK,
        "received {got} bytes for {lost} lost blocks"
    );
    assert_eq!(c.c.fetched.load(SeqCst), lost, "counted as fetched");
    assert_eq!(
        c.c.damaged.load(SeqCst),
        lost,
        "each damaged block counted once"
    );
}

#[test]
fn a_refetch_is_counted_as_fetched() {
    let w = World::new(2);
    let c = w.open(64 << 20);
    w.read(&c, 0..10).unwrap();
    let before = c.c.fetched.load(SeqCst);
    assert!(c.refetch(0, &(0..10), c.generation()));
    assert_eq!(c.c.fetched.load(SeqCst), before + 1);
}

#[test]
fn offline_a_clean_complete_cache_serves_without_a_request_and_a_missing_block_fails_at_once() {
    use crate::storage::object::source::OfflineObject;
    let w = World::new(4);
    let len = w.data.len() as u64;
    let c = w.open(4 * BLOCK);
    // Three of the four blocks fetched online, then a clean close.
    assert_eq!(
        w.read(&c, 0..3 * BLOCK).unwrap(),
        w.data[..(3 * BLOCK) as usize]
    );
    c.close();
    drop(c);
    let d = CacheDir::lock(&w.dir()).unwrap();
    assert!(complete_on_disk(&d, len, &(0..3 * BLOCK)).unwrap());
    assert!(
        !complete_on_disk(&d, len, &(0..len)).unwrap(),
        "block 3 missing"
    );
    let pin = w.fake.pin().cloned().unwrap();
    let offline = Arc::new(OfflineObject::new("s3://b/k", pin).unwrap());
    let c = BlockCache::open(offline.clone(), d, 4 * BLOCK).unwrap();
    assert_eq!(
        w.read(&c, 1000..2 * BLOCK).unwrap(),
        w.data[1000..(2 * BLOCK) as usize]
    );
    assert_eq!(offline.stats().gets.load(SeqCst), 0);
    // The missing block: an error naming --offline, with read-ahead asked first (its fetch is
    // spawned on the runtime and must fail, not wait forever).
    c.will_need(0, &(3 * BLOCK..len));
    let e = w.read(&c, 3 * BLOCK..len).unwrap_err();
    assert!(e.to_string().contains("--offline"), "{e}");
    let report = c.remote_report().unwrap();
    assert!(report.offline && report.gets == 0, "{report:?}");
}

#[test]
fn download_ranges_stores_only_the_blocks_of_its_ranges_and_waits_for_them() {
    let w = World::new(8);
    let c = w.open(64 << 20);
    let end = w.data.len() as u64;
    // A file's head and tail, as a table-only index fetches them: blocks 0 and 6..8.
    c.download_ranges(&[0..100, end - BLOCK - 10..end + 50])
        .unwrap();
    assert_eq!(c.counters().0, 3, "blocks 0, 6, 7 and nothing between");
    assert_eq!(w.gets(), 2, "one GET per run of blocks");
    // What the data file holds now is the object's bytes there, read without the cache.
    let f = std::fs::File::open(c.data_path()).unwrap();
    let mut head = vec![0u8; 100];
    f.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head, &w.data[..100]);
    let mut tail = vec![0u8; BLOCK as usize];
    f.read_exact_at(&mut tail, end - BLOCK).unwrap();
    assert_eq!(tail, &w.data[(end - BLOCK) as usize..]);
    // Again: nothing fetched; an empty or out-of-object range fetches nothing either.
    c.download_ranges(&[0..100, end..end + 10, 5..5]).unwrap();
    assert_eq!(w.gets(), 2);
}
