"""What mounting a zip at an S3 URL costs when it is indexed from its central directory alone
(issue 22), against the whole download a mount with decoded views still makes, same run.
A zip of N members written by Python's `zipfile` (ZIP_STORED: the real ImageNet JPEGs of
../shared/data/imagenet-sample cycled, `train/<synset>/<k>_<name>`), uploaded to SeaweedFS on
127.0.0.1, reached through the test fault proxy at RATE bytes/s + LATENCY s per request.
Each mount gets a fresh block cache and index directory; the figures are the wall time of
`loosefs mount` (index built, daemon serving) and what `loosefs stats` says was received.
Then one cold epoch of the table-indexed mount in storage order (every member read whole and
checked against its CRC-32), ÷ the link cap; and the same mount and epoch with a block cache
of a tenth of the zip (the tables fit; the epoch evicts as it goes).
Usage: python bench/remote_tables.py [N] [RATE] [LATENCY] (default 20000 100e6 0.05), as root,
with the test venv (scripts/python-env.sh)."""
import json, pathlib, shutil, subprocess, sys, tempfile, time, zipfile
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tests' / 'e2e'))
import servers  # noqa: E402
from test_remote import s3_env  # noqa: E402
SAMPLE = ROOT.parent / 'shared' / 'data' / 'imagenet-sample'
LOOSEFS = ROOT / 'target' / 'release' / 'loosefs'
n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 20000
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100e6
lat = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
w = pathlib.Path(tempfile.mkdtemp(prefix='loosefs-remote-tables-'))
jpegs = sorted(p for p in SAMPLE.rglob('*') if p.is_file())
t = time.monotonic()
with zipfile.ZipFile(w / 'images.zip', 'w', zipfile.ZIP_STORED) as z:
    for k in range(n):
        p = jpegs[k % len(jpegs)]
        z.write(p, f'train/{p.parent.name}/{k}_{p.name}')
size = (w / 'images.zip').stat().st_size
print(f"zip: {n} members, {size/1e6:.1f} MB, written in {time.monotonic() - t:.0f} s")
s = servers.Seaweed(w / 'weed').start()
px = servers.FaultProxy(s.port, rate=rate, latency=lat).start()
s.put('big/images.zip', w / 'images.zip')
(w / 'images.zip').unlink()
print(f"link: {rate/1e6:.0f} MB/s + {lat*1000:.0f} ms per request (fault proxy before SeaweedFS on 127.0.0.1)")


def stats(mnt):
    out = subprocess.run([str(LOOSEFS), 'stats', str(mnt), '--json'], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)['remote']


def mount(tag, *extra, cache='64G'):
    mnt = w / f'mnt-{tag}'
    mnt.mkdir()
    a = ["--endpoint-url", f"http://127.0.0.1:{px.port}", "--allow-http", "--cache-size", cache,
         "--cache-dir", str(w / f'cache-{tag}'), "--index-dir", str(w / f'idx-{tag}'), "--log", str(w / f'{tag}.log')]
    t = time.monotonic()
    subprocess.run([str(LOOSEFS), 'mount', 's3://packs/big/images.zip', str(mnt), *a, *extra], env=s3_env(),
                   check=True, capture_output=True)
    return mnt, time.monotonic() - t, stats(mnt)


try:
    rows, epochs = [], {}
    small = f'{max(64, size // 10 >> 20)}M'
    for tag, extra, cache in [('tables', (), '64G'), ('views', ('--decode', 'npy'), '64G'), ('small', (), small)]:
        mnt, dt, st = mount(tag, *extra, cache=cache)
        rows.append((tag, dt, st))
        if tag != 'views':
            files = sorted((p for p in mnt.rglob('*') if p.is_file() and '.loosefs' not in p.parts),
                           key=lambda p: int(p.name.split('_', 1)[0]))
            assert len(files) == n, len(files)
            t, got = time.monotonic(), 0
            for p in files:
                got += len(p.read_bytes())
            epoch = time.monotonic() - t
            epochs[tag] = (epoch, got, stats(mnt))
        subprocess.run([str(LOOSEFS), 'umount', str(mnt)], check=True)
    for tag, dt, st in rows:
        what = {'tables': 'tables alone (default)', 'views': 'whole download (--decode npy)',
                'small': f'tables alone, --cache-size {small}'}[tag]
        print(f"  mount, {what:30s} {dt:6.2f} s  GETs {st['gets']:4d}  received {st['bytes_received']/1e6:9.2f} MB"
              f" = {100*st['bytes_received']/size:6.2f}% of the zip")
    tb = rows[0][2]['bytes_received']
    print(f"  bound (2 round trips + those bytes at the cap): {2*lat + tb/rate:.2f} s; "
          f"the whole zip at the cap: {2*lat + size/rate:.2f} s")
    for tag, (epoch, got, after) in epochs.items():
        print(f"  cold epoch in storage order after the {tag} mount: {n/epoch:.0f} files/s, {got/epoch/1e6:.1f} MB/s "
              f"= {got/epoch/rate:.2f}x the link cap; received {after['bytes_received']/1e6:.1f} MB in "
              f"{after['gets']} GETs, {after['blocks_evicted']} blocks evicted")
finally:
    for m in w.glob('mnt-*'):
        subprocess.run([str(LOOSEFS), 'umount', str(m)], capture_output=True)
    px.stop() if hasattr(px, 'stop') else None
    s.stop()
    shutil.rmtree(w, ignore_errors=True)
