//! Several remote objects as one storage: the shards of a foreign dataset at a URL, each
//! object ([`crate::catalog::ObjectId`] = its position) served by its own
//! [`super::block_cache::BlockCache`], pinned to its own ETag. Every verb goes to the object it
//! names; the counters of `stats` are the sums over the objects.

use crate::report::RemoteReport;
use crate::storage::ObjectId;
use crate::storage::Storage;
use crate::storage::block_cache::BlockCache;
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// The block caches of a dataset's objects, in the catalog's object order.
#[derive(Debug)]
pub struct ObjectSet {
    url: String,
    cache_root: String,
    objects: Vec<Arc<BlockCache>>,
}

impl ObjectSet {
    /// The storage of `objects` (object k = `objects[k]`), reported under the dataset's `url`
    /// and the cache root `cache_root`.
    pub fn new(url: &str, cache_root: &str, objects: Vec<Arc<BlockCache>>) -> ObjectSet {
        ObjectSet {
            url: url.to_string(),
            cache_root: cache_root.to_string(),
            objects,
        }
    }

    fn get(&self, obj: ObjectId) -> Option<&BlockCache> {
        self.objects.get(obj as usize).map(|o| o.as_ref())
    }
}

fn no_object(obj: ObjectId) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no object {obj}"))
}

impl Storage for ObjectSet {
    fn len(&self, obj: ObjectId) -> u64 {
        self.get(obj).map_or(0, |o| o.len(0))
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.get(obj)
            .ok_or_else(|| no_object(obj))?
            .read_at(0, off, buf)
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        if let Some(o) = self.get(obj) {
            o.will_need(0, r);
        }
    }

    fn will_need_exact(&self, obj: ObjectId, ranges: &[Range<u64>]) {
        if let Some(o) = self.get(obj) {
            o.will_need_exact(0, ranges);
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        self.get(obj).map_or(0, |o| o.resident_bytes(0, r))
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        self.get(obj).is_some_and(|o| o.resident(0, r))
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.get(obj).map_or(Ok(()), |o| o.release(0, r))
    }

    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.get(obj).map_or(Ok(()), |o| o.evict(0, r))
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.get(obj).ok_or_else(|| no_object(obj))?.pin(0, r)
    }

    /// The sum of the objects' generations: it changes whenever any of them fetched again.
    fn generation(&self) -> u64 {
        self.objects.iter().map(|o| o.generation()).sum()
    }

    fn refetch(&self, obj: ObjectId, r: &Range<u64>, _seen: u64) -> bool {
        // `seen` is the set's sum, not the object's generation: the object fetches again
        // whatever another reader did since (at worst one GET more than needed).
        self.get(obj)
            .is_some_and(|o| o.refetch(0, r, o.generation()))
    }

    fn close(&self) {
        for o in &self.objects {
            o.close();
        }
    }

    fn remote_report(&self) -> Option<RemoteReport> {
        let mut sum = RemoteReport {
            url: self.url.clone(),
            etag: format!("{} objects, each pinned to its own", self.objects.len()),
            cache_dir: self.cache_root.clone(),
            ..Default::default()
        };
        for r in self.objects.iter().filter_map(|o| o.remote_report()) {
            sum.gets += r.gets;
            sum.bytes_received += r.bytes_received;
            sum.failed_gets += r.failed_gets;
            sum.blocks_fetched += r.blocks_fetched;
            sum.blocks_evicted += r.blocks_evicted;
            sum.blocks_damaged += r.blocks_damaged;
            sum.cached_bytes += r.cached_bytes;
            sum.cache_limit_bytes += r.cache_limit_bytes;
            sum.offline |= r.offline;
            sum.exact_gets += r.exact_gets;
            sum.exact_bytes_received += r.exact_bytes_received;
            sum.exact_bytes_served += r.exact_bytes_served;
            sum.exact_held_bytes += r.exact_held_bytes;
        }
        Some(sum)
    }

    fn warm_ahead(&self) -> u64 {
        self.objects.first().map_or(0, |o| o.warm_ahead())
    }

    fn warm_budget(&self) -> Option<u64> {
        Some(self.objects.iter().filter_map(|o| o.warm_budget()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::block_cache::{BLOCK, CacheDir, check_root};
    use crate::storage::object::fake::FakeObject;
    use crate::storage::object::source::ObjectSource;

    /// Three objects of different bytes and sizes, each in its own block cache.
    fn set(tmp: &std::path::Path) -> (ObjectSet, Vec<Vec<u8>>, Vec<Arc<FakeObject>>) {
        let root = tmp.join("cache");
        check_root(&root).unwrap();
        let mut caches = Vec::new();
        let mut datas = Vec::new();
        let mut fakes = Vec::new();
        for (k, len) in [BLOCK + 17, 3 * BLOCK, 5000].into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ (k as u8 * 85)).collect();
            let fake = Arc::new(FakeObject::new(&format!("s3://b/d/{k}"), data.clone()));
            let dir = CacheDir::lock(&root.join(format!("obj{k}"))).unwrap();
            let source: Arc<dyn ObjectSource> = fake.clone();
            caches.push(Arc::new(BlockCache::open(source, dir, 8 * BLOCK).unwrap()));
            datas.push(data);
            fakes.push(fake);
        }
        (ObjectSet::new("s3://b/d/", "cache", caches), datas, fakes)
    }

    #[test]
    fn each_object_id_reads_its_own_object() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, datas, _) = set(tmp.path());
        for (k, d) in datas.iter().enumerate() {
            let k = k as ObjectId;
            assert_eq!(s.len(k), d.len() as u64);
            let mut buf = vec![0u8; d.len()];
            s.read_at(k, 0, &mut buf).unwrap();
            assert_eq!(&buf, d);
            // A range crossing a block boundary, from the middle.
            let off = (d.len() / 2) as u64;
            let mut part = vec![0u8; d.len() / 3];
            s.read_at(k, off, &mut part).unwrap();
            assert_eq!(&part[..], &d[off as usize..off as usize + part.len()]);
        }
        assert_eq!(s.len(3), 0);
        let e = s.read_at(3, 0, &mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = s.read_at(2, 4999, &mut [0u8; 2]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_replaced_object_fails_its_reads_only_and_counters_sum() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, datas, fakes) = set(tmp.path());
        fakes[1].replace(vec![7u8; datas[1].len()]);
        let mut buf = vec![0u8; 100];
        assert!(s.read_at(1, 0, &mut buf).is_err());
        for k in [0, 2] {
            s.read_at(k, 0, &mut buf).unwrap();
            assert_eq!(&buf[..], &datas[k as usize][..100]);
        }
        let r = s.remote_report().unwrap();
        let gets: u64 = fakes
            .iter()
            .map(|f| f.stats().gets.load(std::sync::atomic::Ordering::SeqCst))
            .sum();
        assert_eq!(r.gets, gets);
        let limits: u64 = s.objects.iter().map(|o| o.limit()).sum();
        assert_eq!(r.cache_limit_bytes, limits);
        assert!(limits > 0);
        assert!(r.failed_gets >= 1);
    }

    #[test]
    fn a_download_leaves_the_whole_object_in_the_data_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, datas, fakes) = set(tmp.path());
        let c = &s.objects[1];
        c.download().unwrap();
        assert_eq!(std::fs::read(c.data_path()).unwrap(), datas[1]);
        // Every block is cached: reads make no more GETs.
        let before = fakes[1]
            .stats()
            .gets
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut buf = vec![0u8; datas[1].len()];
        s.read_at(1, 0, &mut buf).unwrap();
        assert_eq!(buf, datas[1]);
        assert_eq!(
            fakes[1]
                .stats()
                .gets
                .load(std::sync::atomic::Ordering::SeqCst),
            before
        );
    }
}
