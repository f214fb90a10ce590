"""Mount cost of remote foreign datasets (issue 22): `loosefs info URL` (which opens the dataset
exactly as a mount does) through the test fault proxy at RATE bytes/s + LATENCY s per request
before SeaweedFS on 127.0.0.1, first (index built: every object downloaded and scanned) and again
with the kept index on a fresh block cache. The formats' own writers' sets in
../shared/data/formats. Usage: python bench/remote_formats.py [RATE] [LATENCY] (default 100e6
0.05), with the test venv (scripts/python-env.sh)."""
import os, pathlib, shutil, subprocess, sys, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tests' / 'e2e'))
import servers  # noqa: E402
from test_remote import s3_env  # noqa: E402
F = ROOT.parent / 'shared' / 'data' / 'formats'
LOOSEFS = ROOT / 'target' / 'release' / 'loosefs'
rate = float(sys.argv[1]) if len(sys.argv) > 1 else 100e6
lat = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
w = pathlib.Path(tempfile.mkdtemp(prefix='loosefs-remote-formats-'))
s = servers.Seaweed(w / 'weed').start()
for name in ['mds', 'litdata', 'webdataset']:
    for p in (F / name).iterdir():
        s.put(f"{name}/{p.name}", p)
px = servers.FaultProxy(s.port, rate=rate, latency=lat).start()
print(f"link: {rate/1e6:.0f} MB/s + {lat*1000:.0f} ms per request (fault proxy before SeaweedFS on 127.0.0.1)")
for name in ['mds', 'litdata', 'webdataset']:
    size = sum(p.stat().st_size for p in (F / name).iterdir())
    idx = w / f'idx-{name}'
    for run in ['first (index built)', 'kept index, fresh cache']:
        args = ["--endpoint-url", f"http://127.0.0.1:{px.port}", "--allow-http", "--cache-size", "1G",
                "--cache-dir", str(w / f'c-{name}-{run[:4]}'), "--index-dir", str(idx)]
        n = px.requests; t = time.monotonic()
        r = subprocess.run([str(LOOSEFS), "info", f"s3://packs/{name}/", *args],
                           env=s3_env(), capture_output=True, text=True, check=True)
        dt = time.monotonic() - t
        got = [l for l in r.stdout.splitlines() if l.startswith('requests:')][0]
        print(f"{name:10s} {size/1e6:5.1f} MB  {run:26s} {dt:6.2f} s  requests {px.requests - n:3d}  ({got.split(':',1)[1].strip()})"
              f"  bound {2*lat + size/rate:5.2f} s")
s.stop()
shutil.rmtree(w, ignore_errors=True)
