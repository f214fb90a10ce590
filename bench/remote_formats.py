"""What each foreign format costs to mount (issue 22), locally and over S3. `loosefs info`
(which opens a dataset exactly as a mount does):
- local (the host disk, its page cache dropped before each first run): first (scan + index
  kept in --index-dir), again (kept index), another node (a fresh --index-dir) with the shared
  index `loosefs index SRC` wrote beside the dataset;
- over S3 through the test fault proxy at RATE bytes/s + LATENCY s per request before SeaweedFS
  on 127.0.0.1: first (index built: every object downloaded and scanned), again with the kept
  index on a fresh block cache, another node (fresh index directory and cache) with the shared
  index `loosefs index URL` wrote beside the dataset (`<URL>.loosefs-index`), and the same with
  the proxy bypassed (CPU only).
The formats' own writers' sets in ../shared/data/formats (GulpIO measured locally only); with SCALE > 0 also an MDS dataset of SCALE samples written by MosaicML's MDSWriter
(64 MiB shards; every sample one real ImageNet JPEG re-encoded at 64x64, label and synset of
1,000 classes), indexed once without the proxy.
Usage: python bench/remote_formats.py [RATE] [LATENCY] [SCALE] (default 100e6 0.05 0), as root
(drop_caches), with the test venv (scripts/python-env.sh)."""
import io, pathlib, shutil, subprocess, sys, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tests' / 'e2e'))
import servers  # noqa: E402
from test_remote import s3_env  # noqa: E402
F = ROOT.parent / 'shared' / 'data' / 'formats'
LOOSEFS = ROOT / 'target' / 'release' / 'loosefs'
rate = float(sys.argv[1]) if len(sys.argv) > 1 else 100e6
lat = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
scale = int(float(sys.argv[3])) if len(sys.argv) > 3 else 0
w = pathlib.Path(tempfile.mkdtemp(prefix='loosefs-remote-formats-'))
s = servers.Seaweed(w / 'weed').start()
px = servers.FaultProxy(s.port, rate=rate, latency=lat).start()


def args(port, tag, idx):
    return ["--endpoint-url", f"http://127.0.0.1:{port}", "--allow-http", "--cache-size", "64G",
            "--cache-dir", str(w / f'c-{tag}'), "--index-dir", str(idx)]


def run(cmd, url, a):
    n, t = px.requests, time.monotonic()
    r = subprocess.run([str(LOOSEFS), cmd, url, *a], env=s3_env(), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"loosefs {cmd} {url}: {r.stderr}")
    got = [ln for ln in r.stdout.splitlines() if ln.startswith('requests:')]
    return time.monotonic() - t, px.requests - n, got[0].split(':', 1)[1].strip() if got else ''


def write_mds(n, out):
    """n samples by MDSWriter: one real JPEG per class re-encoded at 64x64, cycled (the writer
    stores an opened JPEG file's own bytes)."""
    from PIL import Image
    from streaming import MDSWriter
    classes = sorted(p for p in (ROOT.parent / 'shared' / 'data' / 'imagenet-sample').iterdir() if p.is_dir())
    small = w / 'small'
    small.mkdir()
    jpegs = []
    for i, c in enumerate(classes):
        dst = small / f'{c.name}.jpg'
        Image.open(next(iter(sorted(c.iterdir())))).convert('RGB').resize((64, 64)).save(dst, 'JPEG', quality=90)
        jpegs.append((i, c.name, Image.open(dst)))
    with MDSWriter(out=str(out), columns={"image": "jpeg", "label": "int", "synset": "str"},
                   size_limit=64 << 20) as wr:
        for k in range(n):
            i, c, im = jpegs[k % len(jpegs)]
            wr.write({"image": im, "label": i, "synset": c})


# name: (local source, S3 URL under s3://packs/)
SETS = {
    'mds': ('mds', 'mds/'), 'litdata': ('litdata', 'litdata/'), 'webdataset': ('webdataset', 'webdataset/'),
    'tfrecord': ('tfrecord', 'tfrecord/'), 'hf-parquet': ('hf-parquet', 'hf-parquet/'),
    'zip': ('zip/images.zip', 'zip/images.zip'), 'ffcv': ('ffcv/jpg.beton', 'ffcv/jpg.beton'),
    'gulpio': ('gulpio', None),
}


def local_rows(name, src):
    """First, kept and shared-index opens of a local copy (so the shared index is written beside it)."""
    top = w / 'local' / name
    shutil.copytree(F / pathlib.Path(src).parts[0], top)
    path = top / pathlib.Path(src).relative_to(pathlib.Path(src).parts[0]) if '/' in src else top
    rows = []
    for what, idx in [('first (scan, index kept)', 'a'), ('again (kept index)', 'a')]:
        subprocess.run(['sh', '-c', 'sync; echo 3 > /proc/sys/vm/drop_caches'], check=True)
        t = time.monotonic()
        subprocess.run([str(LOOSEFS), 'info', str(path), '--index-dir', str(w / f'lidx-{name}-{idx}')],
                       check=True, capture_output=True)
        rows.append((what, time.monotonic() - t))
    subprocess.run([str(LOOSEFS), 'index', str(path), '--index-dir', str(w / f'lidx-{name}-i')], check=True,
                   capture_output=True)
    subprocess.run(['sh', '-c', 'sync; echo 3 > /proc/sys/vm/drop_caches'], check=True)
    t = time.monotonic()
    subprocess.run([str(LOOSEFS), 'info', str(path), '--index-dir', str(w / f'lidx-{name}-n')], check=True,
                   capture_output=True)
    rows.append(('another node, shared index', time.monotonic() - t))
    return rows


sets = [(name, F / pathlib.Path(src).parts[0], src, url) for name, (src, url) in SETS.items()]
if scale:
    t = time.monotonic()
    write_mds(scale, w / 'mds-large')
    print(f"wrote {scale} MDS samples in {time.monotonic() - t:.0f} s")
    sets.append((f'mds-{scale}', w / 'mds-large', None, f'mds-{scale}/'))
for name, d, _, url in sets:
    if url:
        for p in sorted(d.rglob('*')):
            if p.is_file():
                s.put(f"{url.split('/')[0]}/{p.relative_to(d)}", p)
print(f"link: {rate/1e6:.0f} MB/s + {lat*1000:.0f} ms per request (fault proxy before SeaweedFS on 127.0.0.1)")
for name, d, src, key in sets:
    size = sum(p.stat().st_size for p in d.rglob('*') if p.is_file())
    print(f"{name}: {size/1e6:.1f} MB")
    if src:
        for what, dt in local_rows(name, src):
            print(f"  local  {what:30s} {dt:6.2f} s")
    if not key:
        continue
    url = f"s3://packs/{key}"
    idx = w / f'idx-{name}'
    rows = []
    if not name.startswith('mds-'):
        rows.append(('first (index built)', run('info', url, args(px.port, f'{name}-1', idx))))
        rows.append(('again (kept index, fresh cache)', run('info', url, args(px.port, f'{name}-2', idx))))
    t = time.monotonic()
    r = subprocess.run([str(LOOSEFS), "index", url, *args(s.port, f'{name}-i', w / f'idx-{name}-i')],
                       env=s3_env(), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    ti = time.monotonic() - t
    ikey = f"{key}.loosefs-index"
    shared = s.client().head_object(Bucket='packs', Key=ikey)['ContentLength']
    rows.append(('another node, shared index', run('info', url, args(px.port, f'{name}-3', w / f'idx-{name}-3'))))
    rows.append(('same, no proxy (CPU only)', run('info', url, args(s.port, f'{name}-4', w / f'idx-{name}-4'))))
    print(f"  S3: `loosefs index` (no proxy) {ti:.1f} s; shared index {shared/1e6:.3f} MB = "
          f"{100*shared/size:.2f}% of the dataset")
    for what, (dt, reqs, got) in rows:
        print(f"  S3     {what:30s} {dt:6.2f} s  requests {reqs:3d}  ({got})")
    print(f"  S3 bound with the shared index (2 round trips + the index at the cap): {2*lat + shared/rate:.2f} s; "
          f"without (the dataset at the cap): {2*lat + size/rate:.2f} s")
s.stop()
shutil.rmtree(w, ignore_errors=True)
