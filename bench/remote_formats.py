"""Mount cost of remote foreign datasets (issue 22): `loosefs info URL` (which opens the dataset
exactly as a mount does) through the test fault proxy at RATE bytes/s + LATENCY s per request
before SeaweedFS on 127.0.0.1:
- first (index built: every object downloaded and scanned);
- again with the kept index on a fresh block cache;
- another node (fresh index directory and cache) with the shared index `loosefs index URL` wrote
  beside the dataset (`<URL>.loosefs-index`).
The formats' own writers' sets in ../shared/data/formats; with SCALE > 0 also an MDS dataset of
SCALE samples written by MosaicML's MDSWriter (64 MiB shards; every sample one real ImageNet
JPEG re-encoded at 64x64, label and synset of 1,000 classes), indexed once without the proxy.
Usage: python bench/remote_formats.py [RATE] [LATENCY] [SCALE] (default 100e6 0.05 0), with the
test venv (scripts/python-env.sh)."""
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


sets = [(name, F / name) for name in ['mds', 'litdata', 'webdataset']]
if scale:
    t = time.monotonic()
    write_mds(scale, w / 'mds-large')
    print(f"wrote {scale} MDS samples in {time.monotonic() - t:.0f} s")
    sets.append((f'mds-{scale}', w / 'mds-large'))
for name, d in sets:
    for p in sorted(d.rglob('*')):
        if p.is_file():
            s.put(f"{name}/{p.relative_to(d)}", p)
print(f"link: {rate/1e6:.0f} MB/s + {lat*1000:.0f} ms per request (fault proxy before SeaweedFS on 127.0.0.1)")
for name, d in sets:
    url = f"s3://packs/{name}/"
    size = sum(p.stat().st_size for p in d.rglob('*') if p.is_file())
    idx = w / f'idx-{name}'
    rows = []
    if not name.startswith('mds-'):
        rows.append(('first (index built)', run('info', url, args(px.port, f'{name}-1', idx))))
        rows.append(('kept index, fresh cache', run('info', url, args(px.port, f'{name}-2', idx))))
    t = time.monotonic()
    r = subprocess.run([str(LOOSEFS), "index", url, *args(s.port, f'{name}-i', w / f'idx-{name}-i')],
                       env=s3_env(), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    ti = time.monotonic() - t
    shared = s.client().head_object(Bucket='packs', Key=f'{name}/.loosefs-index')['ContentLength']
    rows.append(('shared index, new node', run('info', url, args(px.port, f'{name}-3', w / f'idx-{name}-3'))))
    rows.append(('same, no proxy (CPU only)', run('info', url, args(s.port, f'{name}-4', w / f'idx-{name}-4'))))
    print(f"{name}: {size/1e6:.1f} MB; `loosefs index` (direct, no proxy) {ti:.1f} s; shared index "
          f"{shared/1e6:.2f} MB = {100*shared/size:.2f}% of the dataset")
    for what, (dt, reqs, got) in rows:
        print(f"  {what:26s} {dt:6.2f} s  requests {reqs:3d}  ({got})")
    print(f"  bound with the shared index (2 round trips + the index at the cap): {2*lat + shared/rate:.2f} s; "
          f"without (the dataset at the cap): {2*lat + size/rate:.2f} s")
s.stop()
shutil.rmtree(w, ignore_errors=True)
