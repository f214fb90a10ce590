"""Mount flags checked against the kernel, not the daemon's report: `--threads` (the daemon's
FUSE worker threads in /proc/PID/task), `--decode-threads` (its decode threads there),
`--read-ahead-kb` (the mount's bdi read_ahead_kb in sysfs), `umount` of a busy mount (refused with
the fix) and `umount --lazy` (detached); and the foreign-source flags `--format`, `--label`,
`--class-names` (what ImageFolder sees); readiness on `NOTIFY_SOCKET` (systemd)."""
import errno
import json
import os
import shutil
import pathlib
import re
import subprocess
import time
import sys

import pytest
import torchvision

from conftest import DATA, ROOT, loosefs_bin, missing_prerequisite, need_mount

FORMATS = DATA / "formats"


def run(*args, check=True):
    return subprocess.run([loosefs_bin(), *map(str, args)], check=check, capture_output=True, text=True)


def daemon_pid(mnt):
    return json.loads(run("stats", mnt, "--json").stdout)["daemon"]["pid"]


def task_names(pid):
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        out.append(pathlib.Path(f"/proc/{pid}/task/{t}/comm").read_text().strip())
    return out


def possible_cpus() -> int:
    """CPUs the kernel may bring up (/sys/devices/system/cpu/possible: `0-1`, `0,2-3`): one
    FUSE-over-io_uring queue each."""
    n = 0
    for part in pathlib.Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


@pytest.mark.parametrize("transport", ["classic", "uring"])
def test_threads_and_decode_threads_are_the_daemons_threads(pack, tmp_path, transport):
    """Over /dev/fuse, `--threads` is fuser's workers; over io_uring, the ring entries (one
    thread each): split over one queue per possible CPU, at least 4 a queue. Decode threads
    are exactly as asked on both."""
    need_mount()
    if transport == "uring" and not pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists():
        missing_prerequisite("the kernel has no FUSE over io_uring (/sys/module/fuse/parameters/enable_uring)")
    counts = {}
    for n in (2, 6, 20):
        mnt = tmp_path / f"mnt{n}"
        mnt.mkdir()
        run("mount", pack, mnt, "--threads", n, "--decode", "npy", "--decode-threads", n + 1,
            "--transport", transport)
        try:
            st = json.loads(run("stats", mnt, "--json").stdout)
            names = task_names(st["daemon"]["pid"])
            counts[n] = (sum(x.startswith("fuser") for x in names), sum(x.startswith("uring-") for x in names),
                         sum(x.startswith("loosefs-decode") for x in names))
        finally:
            run("umount", mnt)
    assert [counts[n][2] for n in (2, 6, 20)] == [3, 7, 21], counts
    if transport == "classic":
        # fuser runs the asked number of workers (plus none or one of its own); no ring.
        assert counts[6][0] - counts[2][0] == 4 and counts[20][0] - counts[6][0] == 14, counts
        assert all(c[1] == 0 for c in counts.values()), counts
    else:
        q = possible_cpus()
        want = {n: max(-(-n // q), 4) * q for n in counts}
        assert {n: c[1] for n, c in counts.items()} == want, (counts, want)


def test_read_ahead_kb_sets_the_mounts_bdi(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", pack, mnt, "--read-ahead-kb", 1024)
    try:
        dev = os.stat(mnt).st_dev
        bdi = pathlib.Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        assert bdi.read_text().strip() == "1024"
    finally:
        run("umount", mnt)


def test_busy_mount_is_refused_and_lazy_detaches_it(pack, tmp_path):
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", pack, mnt)
    first = next(p for p in mnt.rglob("*") if p.is_file())
    f = open(first, "rb")
    try:
        r = run("umount", mnt, check=False)
        assert r.returncode == 1 and "busy" in r.stderr and "--lazy" in r.stderr, r.stderr
        assert os.path.ismount(mnt)
        run("umount", mnt, "--lazy")
        assert not os.path.ismount(mnt)
        assert f.read(4)  # the open file still reads until closed
    finally:
        f.close()


def test_format_label_and_class_names_flags(tmp_path):
    need_mount()
    if not FORMATS.is_dir():
        missing_prerequisite(f"{FORMATS} is missing")
    manifest = json.loads((FORMATS / "manifest.json").read_text())
    names = tmp_path / "names.txt"
    names.write_text("".join(f"class-{i:02d}\n" for i in range(48)))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # --format forces the reader; --label names the MDS column; --class-names renames classes.
    run("mount", FORMATS / "mds", mnt, "--format", "mds", "--label", "label", "--class-names", names, "--index-dir", tmp_path / "idx")
    try:
        ds = torchvision.datasets.ImageFolder(str(mnt))
        assert ds.classes == [f"class-{i:02d}" for i in range(48)]
        assert [y for _, y in ds.samples] == list(range(48))
    finally:
        run("umount", mnt)
    # --format naming the wrong reader fails, saying why.
    r = run("info", FORMATS / "mds", "--format", "tfrecord", "--index-dir", tmp_path / "idx", check=False)
    assert r.returncode == 65 and "TFRecord" in r.stderr, r.stderr  # in no format it reads
    # An unknown --format value lists the known ones.
    r = run("info", FORMATS / "mds", "--format", "nope", check=False)
    assert r.returncode == 2 and "webdataset" in r.stderr and "ffcv" in r.stderr, r.stderr
    assert len(manifest["classes"]) == 48


def test_decode_ahead_decodes_the_next_files_before_they_are_read(pack, source, tmp_path):
    """`--decode-ahead N`: once `.npy` reads follow each other in storage order (the second one
    continues the walk), the next N are decoded before anyone asks (their reads are cache hits,
    no decode at read time); with 0, each read decodes."""
    need_mount()
    import time

    jpegs = sorted(p for p in pathlib.Path(source).rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
    rel = [p.relative_to(source) for p in jpegs[:6]]
    for ahead in (3, 0):
        mnt = tmp_path / f"mnt{ahead}"
        mnt.mkdir()
        run("mount", pack, mnt, "--decode", "npy", "--decode-ahead", ahead, "--push-ahead", 0)
        try:
            dec = lambda: json.loads(run("stats", mnt, "--json").stdout)["decode"]
            for r in rel[:2]:
                (mnt / r.with_suffix(".npy")).read_bytes()
            if ahead:
                t = time.time()
                while dec()["decoded_ahead"] < ahead:
                    assert time.time() - t < 20, dec()
                    time.sleep(0.05)
            d0 = dec()
            for r in rel[2:5]:
                (mnt / r.with_suffix(".npy")).read_bytes()
            d1 = dec()
            # misses = READs that found no decoded view (it is decoded then, once per file);
            # hits = READs served from a decoded view.
            if ahead:
                assert d1["misses"] == d0["misses"] and d1["hits"] - d0["hits"] >= 3, (d0, d1)
            else:
                assert d0["decoded_ahead"] == 0, d0
                assert d1["misses"] - d0["misses"] == 3, (d0, d1)
        finally:
            run("umount", mnt)


def test_stats_prometheus_is_valid_exposition_and_says_what_the_json_says(mount):
    """`stats --format prometheus` and `<mnt>/.loosefs/metrics`, parsed by prometheus_client's
    own OpenMetrics parser (the oracle): every plain metric labelled with the mountpoint and
    documented (`# HELP`), values equal to the JSON's, what only grows a counter (`_total`) and
    what goes both ways a gauge, latency quantiles per op, and one histogram family whose
    buckets are cumulative and whose count per op is the JSON's request count."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    from prometheus_client.parser import text_string_to_metric_families as text_format_families

    def scrape():
        text = run("stats", mount, "--format", "openmetrics").stdout
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        plain = {n: f.samples[0] for n, f in fams.items() if n not in ("loosefs_latency_us",
                                                                         "loosefs_request_duration_seconds",
                                                                         "loosefs_build")}
        return fams, plain

    files = sorted(p for p in pathlib.Path(mount).rglob("*") if p.is_file())[:5]
    for f in files:
        f.read_bytes()
    assert run("stats", mount, "--prometheus").stdout.count("\n") > 10
    fams, plain = scrape()
    j = json.loads(run("stats", mount, "--format", "json").stdout)
    mnt = os.path.realpath(mount)
    assert all(s.labels == {"mountpoint": mnt} for s in plain.values())
    # The build serving it: an info family, labelled with its version and commit too.
    build = fams["loosefs_build"]
    assert build.type == "info" and build.samples[0].labels["mountpoint"] == mnt, build
    assert set(build.samples[0].labels) == {"mountpoint", "version", "commit"}, build
    assert all(f.documentation for f in fams.values()), [n for n, f in fams.items() if not f.documentation]
    assert fams["loosefs_bytes_served"].documentation == "Bytes returned by READ."
    assert plain["loosefs_pack_samples"].value == j["pack"]["samples"]
    assert plain["loosefs_daemon_pid"].value == j["daemon"]["pid"]
    assert plain["loosefs_daemon_uptime_seconds"].value > 0
    assert plain["loosefs_bytes_served"].value <= j["bytes_served"]
    # Kinds: what only grows is a counter, exposed as `_total`; sizes held now are gauges.
    for n in ("loosefs_requests_read", "loosefs_bytes_served", "loosefs_errors", "loosefs_prefetch_requests"):
        assert fams[n].type == "counter" and plain[n].name == n + "_total", (n, fams[n])
    for n in ("loosefs_pack_samples", "loosefs_daemon_rss_bytes", "loosefs_prefetch_max_window_bytes",
              "loosefs_order_window_bytes", "loosefs_pin_pinned_bytes"):
        assert fams[n].type == "gauge", (n, fams[n])
    # Request counts and read-ahead figures, one sample per JSON field.
    assert plain["loosefs_requests_read"].value <= j["requests"]["read"] and plain["loosefs_requests_read"].value > 0
    assert plain["loosefs_requests_lookup"].value <= j["requests"]["lookup"]
    for field in ("max_window_bytes", "requests", "bytes", "served_bytes", "unserved_bytes", "hits"):
        assert f"loosefs_prefetch_{field}" in plain, field
    assert plain["loosefs_prefetch_max_window_bytes"].value == j["prefetch"]["max_window_bytes"] > 0
    assert "loosefs_push_ahead_samples" in plain
    assert any(n.startswith("loosefs_page_cache_") for n in plain), sorted(plain)
    q = {(s.labels["op"], s.labels["quantile"]): s.value for s in fams["loosefs_latency_us"].samples}
    assert q[("read", "0.5")] > 0 and q[("read", "0.99")] >= q[("read", "0.5")]
    h = fams["loosefs_request_duration_seconds"]
    assert h.type == "histogram"
    reads = [s for s in h.samples if s.labels.get("op") == "read"]
    buckets = [(float(s.labels["le"]), s.value) for s in reads if s.name.endswith("_bucket")]
    assert [le for le, _ in buckets] == sorted(le for le, _ in buckets) and buckets[-1][0] == float("inf")
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
    count = next(s.value for s in reads if s.name.endswith("_count"))
    # At least the first file is READ (push-ahead may serve the next ones without a READ).
    assert buckets[-1][1] == count >= 1
    assert count <= json.loads(run("stats", mount, "--json").stdout)["latency_us"]["read"]["count"]
    assert next(s.value for s in reads if s.name.endswith("_sum")) > 0
    # Every counter only grows: more reads, then a second scrape.
    for f in sorted(p for p in pathlib.Path(mount).rglob("*") if p.is_file())[5:50]:
        f.read_bytes()
    fams2, plain2 = scrape()
    shrunk = [n for n, f in fams.items() if f.type == "counter" and plain2[n].value < plain[n].value]
    assert not shrunk, shrunk
    # `--format prometheus` and the control file (for node_exporter's textfile collector) hold
    # the same families in Prometheus's text format 0.0.4, parsed by its own parser: each
    # counter family named by its `_total` samples, typed as it is in OpenMetrics.
    listed = os.listdir(os.path.join(mount, ".loosefs"))
    assert "metrics" in listed and "stats" in listed, listed
    for text in (run("stats", mount, "--format", "prometheus").stdout,
                 pathlib.Path(mount, ".loosefs", "metrics").read_text()):
        own = {f.name: f for f in text_format_families(text)}
        # Text 0.0.4 has no info type: OpenMetrics' info family X is the gauge X_info there.
        want = {(n + "_info" if f.type == "info" else n): ("gauge" if f.type == "info" else f.type)
                for n, f in fams.items()}
        assert {n: f.type for n, f in own.items()} == want
        assert all(s.name == n + "_total" for n, f in own.items() if f.type == "counter" for s in f.samples)
        assert "# TYPE loosefs_bytes_served_total counter" in text and "# EOF" not in text
        assert all(f.documentation for f in own.values())
        assert own["loosefs_request_duration_seconds"].type == "histogram"
        s = next(s for s in own["loosefs_pack_samples"].samples)
        assert s.labels == {"mountpoint": mnt} and s.value == j["pack"]["samples"]


def test_metrics_addr_serves_what_stats_prints_to_a_scraper(pack, tmp_path):
    """`mount --metrics-addr 127.0.0.1:PORT` (a free port): `GET /metrics` answers Prometheus
    text 0.0.4 that prometheus_client's parser reads, with the same families and kinds as
    `stats --format prometheus` and counters that grow between scrapes; a scrape asking for
    OpenMetrics (as Prometheus does) gets OpenMetrics that its OpenMetrics parser reads; other
    paths answer 404. A second mount asking for the same address fails, naming the flag and
    the address, and leaves nothing mounted."""
    need_mount()
    import socket
    import urllib.error
    import urllib.request
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
    from prometheus_client.parser import text_string_to_metric_families as text_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mnt, other = tmp_path / "mnt", tmp_path / "other"
    mnt.mkdir()
    other.mkdir()
    run("mount", pack, mnt, "--metrics-addr", f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape(accept=None):
            req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.headers["Content-Type"], r.read().decode()

        kind, text = scrape()
        assert kind.startswith("text/plain; version=0.0.4"), kind
        fams = {f.name: f for f in text_families(text)}
        stats = {f.name: f.type for f in text_families(run("stats", mnt, "--format", "prometheus").stdout)}
        assert {n: f.type for n, f in fams.items()} == stats
        assert fams["loosefs_bytes_served"].type == "counter"
        before = fams["loosefs_requests_lookup"].samples[0].value
        for f in sorted(p for p in mnt.rglob("*") if p.is_file())[:20]:
            f.read_bytes()
        after = {f.name: f for f in text_families(scrape()[1])}
        assert after["loosefs_requests_lookup"].samples[0].value > before
        kind, text = scrape("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        assert kind.startswith("application/openmetrics-text"), kind
        om = {f.name: f for f in om_families(text)}
        assert om["loosefs_bytes_served"].type == "counter" and om["loosefs_pack_samples"].type == "gauge"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30)
        assert e.value.code == 404
        r = run("mount", pack, other, "--metrics-addr", f"127.0.0.1:{port}", check=False)
        assert r.returncode != 0 and f"--metrics-addr 127.0.0.1:{port}" in r.stderr, r.stderr
        assert not os.path.ismount(other)
    finally:
        run("umount", mnt)


def test_metrics_addr_takes_a_host_name_and_port_0_and_says_the_bound_url(pack, tmp_path):
    """`--metrics-addr localhost:0`: a name, not only an IP, and port 0 picks a free port, which
    the mount's line says; that URL serves the metrics, `loosefs_build_info` among them with the
    version and commit `--version` says. Text `stats` names the transport;
    `drop-cache` prints text (`--json`: its report). `mount -f` says the same line when the
    mount is ready (its stderr, read up to that line while the daemon serves)."""
    need_mount()
    import re
    import urllib.request

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("mount", pack, mnt, "--metrics-addr", "localhost:0")
    try:
        url = re.search(r"metrics (http://[^ )]+/metrics)", r.stderr)
        assert url and not url.group(1).endswith(":0/metrics"), r.stderr
        with urllib.request.urlopen(url.group(1), timeout=30) as resp:
            scraped = resp.read().decode()
        assert "loosefs_bytes_served" in scraped
        # The build serving it, as `--version` names it (a bug report can name its build).
        version = run("--version").stdout.split()
        commit = version[2].strip("()")
        assert re.search(rf'^loosefs_build_info{{.*version="{version[1]}",commit="{commit}"}} 1', scraped, re.M), \
            scraped[:500]
        # Text by default, as every command: stats names the transport, drop-cache what it did.
        assert re.search(r"^transport   (FUSE over io_uring|/dev/fuse)", run("stats", mnt).stdout, re.M)
        assert run("drop-cache", mnt).stdout.startswith("cached bytes of the source: ")
        assert "pack_resident_bytes_after" in json.loads(run("drop-cache", mnt, "--json").stdout)
    finally:
        run("umount", mnt)
    bad = run("mount", pack, mnt, "--metrics-addr", "localhost", check=False)
    assert bad.returncode != 0 and "give HOST:PORT" in bad.stderr, bad.stderr
    fg = subprocess.Popen([loosefs_bin(), "mount", str(pack), str(mnt), "--foreground", "--log", "-"],
                          stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in fg.stderr:  # ends at the ready line (or at exit, failing below)
            lines.append(line)
            if line.startswith("loosefs: mounted"):
                break
        assert lines and lines[-1].startswith(f"loosefs: mounted {pack} at {mnt}"), lines
        assert os.path.ismount(mnt)
    finally:
        run("umount", mnt)
        fg.wait(timeout=60)


class Nobody:
    """A copy of the pack readable by `nobody` and an empty mountpoint it owns, under a
    directory it owns; `run(...)` runs a command as `nobody` there."""

    def __init__(self, pack):
        import pwd
        import tempfile

        nobody = pwd.getpwnam("nobody")
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-user-", dir="/tmp"))
        self.work.chmod(0o755)
        self.pack = self.work / "data.pack"
        shutil.copyfile(pack, self.pack)
        self.pack.chmod(0o644)
        self.mnt = self.work / "mnt"
        self.mnt.mkdir()
        os.chown(self.mnt, nobody.pw_uid, nobody.pw_gid)
        os.chown(self.work, nobody.pw_uid, nobody.pw_gid)

    def run(self, *args):
        return subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in args)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(self.work)})

    def reads_right(self, source):
        """The user sees the tree, a file equal to the source's, and `stats`."""
        import hashlib
        files = self.run("find", self.mnt, "-type", "f").stdout.split()
        assert files, "the user sees the tree"
        rel = pathlib.Path(files[0]).relative_to(self.mnt)
        got = self.run("sha256sum", files[0]).stdout.split()[0]
        assert got == hashlib.sha256((pathlib.Path(source) / rel).read_bytes()).hexdigest(), rel
        stats = json.loads(self.run(loosefs_bin(), "stats", self.mnt, "--json").stdout)
        assert stats["bytes_served"] > 0
        return stats

    def close(self):
        subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        shutil.rmtree(self.work, ignore_errors=True)


def test_a_user_mounts_through_fusermount3_or_is_told_why(pack, source):
    """Non-root use: as `nobody`, with /dev/fuse as this machine has it and then (if it was
    not) with the distribution's 0666, a mount either works (through the setuid fusermount3:
    files read, `stats`, and `loosefs umount` by the user, which falls back to `fusermount3 -u`)
    or is refused naming /dev/fuse and its mode. /dev/fuse's mode is restored."""
    need_mount()
    import stat

    if not shutil.which("fusermount3"):
        missing_prerequisite("fusermount3 is not installed (package fuse3)")
    user = Nobody(pack)
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    try:
        for m in ([mode] if mode & 0o006 == 0o006 else [mode, 0o666]):
            os.chmod("/dev/fuse", m)
            r = user.run(loosefs_bin(), "mount", user.pack, user.mnt)
            if m & 0o006 != 0o006:
                assert r.returncode == 77, r.stderr  # permission denied
                assert "/dev/fuse" in r.stderr and f"{m:04o}" in r.stderr, r.stderr
                continue
            assert r.returncode == 0, r.stderr
            try:
                user.reads_right(source)
            finally:
                r = user.run(loosefs_bin(), "umount", user.mnt)
            assert r.returncode == 0, r.stderr
            assert str(user.mnt) not in open("/proc/self/mounts").read()
    finally:
        os.chmod("/dev/fuse", mode)
        user.close()


def test_without_fuse_over_io_uring_auto_serves_through_dev_fuse_and_uring_refuses(pack, source):
    """`enable_uring` off and a user who may not turn it on (`nobody`): `--transport auto`
    mounts over /dev/fuse and reads right, `--transport uring` exits 2 naming the parameter and
    leaves nothing mounted. With it on, the user's mount (through fusermount3) uses the ring.
    The parameter and /dev/fuse's mode are restored."""
    need_mount()
    import stat

    param = pathlib.Path("/sys/module/fuse/parameters/enable_uring")
    if not param.exists():
        missing_prerequisite("this kernel has no FUSE over io_uring (no enable_uring)")
    if not shutil.which("fusermount3"):
        missing_prerequisite("fusermount3 is not installed (package fuse3)")
    was, mode = param.read_text().strip(), stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    user = Nobody(pack)
    try:
        os.chmod("/dev/fuse", 0o666)
        for on in ("N", "Y"):
            param.write_text(on)
            r = user.run(loosefs_bin(), "mount", user.pack, user.mnt, "--transport", "uring")
            if on == "N":
                assert r.returncode == 69, r.stderr  # unavailable (docs/CONFIGURATION.md, exit codes)
                assert "enable_uring" in r.stderr and "--transport uring" in r.stderr, r.stderr
                assert str(user.mnt) not in open("/proc/self/mounts").read()
                r = user.run(loosefs_bin(), "mount", user.pack, user.mnt, "--transport", "auto")
            assert r.returncode == 0, r.stderr
            try:
                kind = user.reads_right(source)["daemon"]["transport"]["kind"]
                assert kind == ("classic" if on == "N" else "uring"), (on, kind)
                assert param.read_text().strip() == on, "a user's mount changed enable_uring"
            finally:
                r = user.run(loosefs_bin(), "umount", user.mnt)
            assert r.returncode == 0, r.stderr
    finally:
        param.write_text(was)
        os.chmod("/dev/fuse", mode)
        user.close()


def test_a_foreground_daemon_tells_systemd_when_it_is_ready_and_when_it_stops(pack, tmp_path):
    """`mount --foreground` under a NOTIFY_SOCKET (what a Type=notify unit gives): READY=1 once
    the mount answers (the files are there when it arrives), STOPPING=1 after the unmount."""
    import socket
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(120)
    daemon = subprocess.Popen([loosefs_bin(), "mount", str(pack), str(mnt), "--foreground", "--log",
                               str(tmp_path / "log")], env=dict(os.environ, NOTIFY_SOCKET=str(path)))
    try:
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg and "STATUS=serving" in msg, msg
        assert any(mnt.iterdir()), "the mount answers once READY=1 is sent"
        run("umount", mnt)
        assert "STOPPING=1" in sock.recv(4096).decode()
        assert daemon.wait(timeout=60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            run("umount", "--lazy", mnt, check=False)
        sock.close()


def test_debug_logs_each_failed_request_with_its_path(pack, source, tmp_path):
    """`mount --debug --log FILE` over a pack with one sample's bytes damaged: each READ of it
    that fails (EIO) is in the log at debug level, naming the file; without `--debug` no
    debug line is written (the damage itself is logged either way, once)."""
    need_mount()
    victim = sorted(p for p in source.rglob("*") if p.is_file())[7]
    data = pack.read_bytes()
    at = data.find(victim.read_bytes())
    assert at > 0
    bad = tmp_path / "bad.pack"
    bad.write_bytes(data[:at + 1000] + bytes([data[at + 1000] ^ 0xFF]) + data[at + 1001:])
    rel = victim.relative_to(source)
    for debug in (True, False):
        mnt, log = tmp_path / f"mnt{debug}", tmp_path / f"log{debug}"
        mnt.mkdir()
        run("mount", bad, mnt, "--log", log, *(["--debug"] if debug else []))
        try:
            with pytest.raises(OSError) as e:
                (mnt / rel).read_bytes()
            assert e.value.errno == errno.EIO
        finally:
            run("umount", mnt)
        text = log.read_text()
        logged = [line for line in text.splitlines() if " DEBUG " in line and str(rel) in line]
        assert bool(logged) == debug, text[-2000:]
        assert debug or " DEBUG " not in text, text[-2000:]
        assert str(rel) in text or victim.name in text, text[-2000:]


def test_mounts_leave_one_log_per_mountpoint_and_no_empty_ones(pack, tmp_path):
    """A hundred mounts and unmounts of one mountpoint write one log file (reused); mounts at
    ten fresh mountpoints (as the Python API makes them) leave no empty log behind."""
    need_mount()
    # At info level every mount writes its log (a quiet mount leaves none behind).
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), RUST_LOG="info")
    logs = tmp_path / "state" / "loosefs" / "log"

    def cycle(mnt):
        subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt)], check=True, env=env, timeout=120,
                       capture_output=True)
        assert any(mnt.iterdir())
        subprocess.run([loosefs_bin(), "umount", str(mnt)], check=True, env=env, timeout=120)

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for _ in range(100):
        cycle(mnt)
    assert len(list(logs.glob("*"))) == 1, list(logs.glob("*")) if logs.exists() else "no log written"
    for i in range(10):
        m = tmp_path / f"fresh{i}"
        m.mkdir()
        cycle(m)
    left = list(logs.glob("*"))
    assert [p for p in left if p.stat().st_size == 0] == [], left
    assert len(left) == 11, left


def test_every_mount_option_comes_from_its_environment_variable_too(pack, tmp_path):
    """As rclone's RCLONE_<FLAG>: LOOSEFS_<FLAG> sets `--flag` (a flag's variable is true but
    for 0, false, no, off or empty), the command line wins, and a bad value is named."""
    need_mount()
    helptext = run("mount", "--help").stdout
    flags = set(re.findall(r"^\s+(?:-\w, )?--([a-z][a-z-]*)", helptext, re.M)) - {"help"}
    # --cache-dir's variable is LOOSEFS_CACHE_DIR, the root of both caches (blocks/, index/).
    missing = sorted(f for f in flags - {"cache-dir"}
                     if f"[env: LOOSEFS_{f.upper().replace('-', '_')}=" not in helptext)
    assert missing == [], missing
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # LOOSEFS_WARM=1 is not the default: ignoring the variable would leave the warm off.
    env = {**os.environ, "LOOSEFS_DECODE": "npy", "LOOSEFS_DECODE_THREADS": "3", "LOOSEFS_WARM": "1"}
    r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt), "--decode-threads", "5"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        assert any(p.suffix == ".npy" for p in mnt.rglob("*.npy")), "LOOSEFS_DECODE=npy made no view"
        names = task_names(daemon_pid(mnt))
        assert sum(x.startswith("loosefs-decode") for x in names) == 5, names  # the flag wins
        assert json.loads(run("stats", mnt, "--json").stdout)["warm"]["state"] not in ("off", "idle", "none")
    finally:
        run("umount", mnt)
    env = {**os.environ, "LOOSEFS_THREADS": "many"}
    r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt)], env=env, capture_output=True, text=True,
                       timeout=10)
    # One line naming the variable the user set, not only the flag they never typed.
    assert r.returncode == 2 and "LOOSEFS_THREADS" in r.stderr and "many" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def mount_help_options() -> dict:
    """Each `loosefs mount` option of --help: its variable and whether it takes a value."""
    helptext = run("mount", "--help").stdout
    out = {}
    for m in re.finditer(r"^\s+(?:-\w, )?--([a-z][a-z-]*)(\[=<[A-Z_]+>\])?( <[A-Z_]+>)?", helptext, re.M):
        if m.group(1) in ("help", "version"):
            continue
        var = "LOOSEFS_" + m.group(1).upper().replace("-", "_")
        out[m.group(1)] = (var, m.group(3) is not None)
    return out


# A value each option's parser refuses (free text options, which take any value, are absent).
BAD_VALUES = {
    "threads": "many", "read-ahead-kb": "x", "prefetch-max-mb": "x", "order-window-mb": "x", "pin": "8X",
    "push-ahead": "x", "passthrough": "sometimes", "transport": "fast", "metrics-addr": "nope",
    "format": "png", "fields": "x", "verify": "x", "chunk-cache": "-1", "cache-size": "-1",
    "max-requests": "x", "retries": "x", "retry-timeout": "x", "request-timeout": "x", "decode": "png",
    "decode-max-side": "x", "decode-cache": "x", "decode-threads": "x", "decode-ahead": "x",
}


def test_a_variable_with_a_value_its_option_refuses_is_named_and_nothing_mounts(pack, tmp_path):
    # Behaviour, not --help text: each variable is read (a value its option refuses fails the
    # mount, in one line naming the variable). A flag's variable takes only true/false words:
    # `disabled` or a typo must not turn allow_other on (reliability-probe.md, env-bool-typo).
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    tried = []
    for flag, (var, takes_value) in mount_help_options().items():
        if not takes_value:
            bads = ["disabled", "flase", "nope"] if flag == "allow-other" else ["maybe"]
        elif flag in BAD_VALUES:
            bads = [BAD_VALUES[flag]]
        else:
            continue
        for bad in bads:
            r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt)], env={**os.environ, var: bad},
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 2, (var, bad, r.stderr)
            assert var in r.stderr and bad in r.stderr, (var, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1, (var, r.stderr)
            tried.append(var)
    assert not os.path.ismount(mnt)
    # Every flag and every option with a checked value (the free-text ones are the log, label,
    # class names, index and cache paths, and the remote endpoint, region, profile and CA).
    assert len(set(tried)) >= 35, sorted(set(tried))


def mount_options_of(mnt) -> str:
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split(" ")
        if f[4] == str(mnt):
            return f[f.index("-") + 3]
    raise AssertionError(f"{mnt} is not mounted")


def test_an_inherited_flag_variable_is_turned_off_on_the_command_line_and_from_python(pack, tmp_path):
    # reliability-probe.md, env-allow-other-no-override: LOOSEFS_ALLOW_OTHER=1 in a job's
    # environment, turned off by `--allow-other=false` and by loosefs.mount(allow_other=False);
    # an inherited LOOSEFS_FOREGROUND=1 does not keep loosefs.mount() from returning.
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "LOOSEFS_ALLOW_OTHER": "1"}
    r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        assert "allow_other" in mount_options_of(mnt), "the variable is read"
    finally:
        run("umount", mnt)
    r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt), "--allow-other=false"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        assert "allow_other" not in mount_options_of(mnt)
    finally:
        run("umount", mnt)
    env = {**os.environ, "LOOSEFS_ALLOW_OTHER": "1", "LOOSEFS_FOREGROUND": "1",
           "PYTHONPATH": str(ROOT / "python"), "LOOSEFS_BIN": loosefs_bin()}
    probe = ("import loosefs, pathlib\n"
             f"m = loosefs.mount({str(pack)!r}, {str(mnt)!r}, allow_other=False)\n"
             "for line in pathlib.Path('/proc/self/mountinfo').read_text().splitlines():\n"
             "    f = line.split(' ')\n"
             f"    if f[4] == {str(mnt)!r}: print('options', f[f.index('-') + 3])\n"
             "m.unmount()\n"
             "print('returned')\n")
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "returned" in r.stdout, (r.stdout, r.stderr)
    assert "options " in r.stdout and "allow_other" not in r.stdout, r.stdout


def test_a_mount_whose_stderr_cannot_be_written_still_succeeds(pack, tmp_path):
    # reliability-probe.md, mount-stderr-broken-abort: the last line ("mounted …") panicked on a
    # full or closed stderr, after the mount was made: exit 134 to a caller who then retries.
    need_mount()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open("/dev/full", "w") as full:
        r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt)], stderr=full, timeout=60)
    try:
        assert r.returncode == 0, r.returncode
        assert os.path.ismount(mnt)
    finally:
        run("umount", mnt)
    # A pipe whose reader went away before the line is written (plain, and --progress-lines).
    for extra in ([], ["--progress-lines"]):
        rd, wr = os.pipe()
        os.close(rd)
        r = subprocess.run([loosefs_bin(), "mount", str(pack), str(mnt), *extra], stderr=wr, timeout=60)
        os.close(wr)
        try:
            assert r.returncode == 0, (extra, r.returncode)
            assert os.path.ismount(mnt)
        finally:
            run("umount", mnt)
    # Standard output closed early (`| head -c1`) or full: no "internal error", no exit 101.
    rd, wr = os.pipe()
    os.close(rd)
    r = subprocess.run([loosefs_bin(), "info", str(pack), "--json"], stdout=wr, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    os.close(wr)
    assert r.returncode == 0 and "internal error" not in r.stderr, (r.returncode, r.stderr)
    with open("/dev/full", "w") as full:
        r = subprocess.run([loosefs_bin(), "info", str(pack), "--json"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert r.returncode == 1 and "internal error" not in r.stderr and "standard output" in r.stderr, r.stderr


def test_under_progress_lines_every_line_of_a_mount_is_json(pack, tmp_path):
    # reliability-probe.md, progress-lines-mounted-not-json: the "mounted" line was plain text,
    # split in two by a newline in the source's name.
    need_mount()
    odd = tmp_path / 'we"ird\\na\nme.pack'
    shutil.copyfile(pack, odd)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([loosefs_bin(), "mount", str(odd), str(mnt), "--progress-lines"], capture_output=True,
                       text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stderr.splitlines()]  # each one JSON
        notes = [x["note"] for x in lines if "note" in x]
        assert any(n.startswith(f"mounted {odd} at {mnt}") for n in notes), lines
    finally:
        run("umount", mnt)


def flood_log(path, writes: int):
    """`writes` writes to `path` on a read-only mount: each fails EROFS, and a `--debug`
    daemon logs a line of ~100 bytes for it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for _ in range(writes):
            with pytest.raises(OSError):
                os.write(fd, b"x")
    finally:
        os.close(fd)


def test_a_live_daemons_log_beside_its_mountpoint_rotates_and_never_follows_a_planted_link(pack):
    # A root daemon logging with --debug into a directory every user may write, its log beside
    # its mountpoint (the layout of 93e3616's hang: the rotation stat'ed its own mount), flooded
    # past the rotation size several times while another user spins on planting a link at the
    # log's name (reliability-probe.md, log-rotate-symlink-race: 176,835 bytes appended to the
    # link's target). The link's target is untouched, at most three files are kept, the
    # daemon's stderr follows the live file, and the daemon answers and unmounts after.
    import tempfile
    need_mount()
    if shutil.which("setpriv") is None:
        missing_prerequisite("setpriv is not installed (util-linux)")
    base = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-logs-", dir="/tmp"))
    try:
        base.chmod(0o755)
        shared = base / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        victim = base / "victim"
        victim.write_text("root's file\n")
        victim.chmod(0o644)
        mnt, log = shared / "mnt", shared / "mnt.log"
        mnt.mkdir()
        run("mount", pack, mnt, "--log", log, "--debug")
        pid = json.loads(run("stats", mnt, "--json").stdout)["daemon"]["pid"]
        planter = subprocess.Popen(
            ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", sys.executable, "-c",
             "import os, sys\n"
             "while True:\n"
             "    try:\n"
             "        os.symlink(sys.argv[1], sys.argv[2])\n"
             "    except OSError:\n"
             "        pass\n", str(victim), str(log)])
        try:
            first = next(p for p in sorted(mnt.rglob("*")) if p.is_file())
            flood_log(first, 400_000)  # ~40 MB, five rotations
        finally:
            planter.kill()
            planter.wait(timeout=30)
        assert victim.read_text() == "root's file\n", "the daemon wrote through a planted link"
        kept = sorted(p.name for p in shared.glob("mnt.log*"))
        assert "mnt.log.2" in kept, kept  # rotated twice at least
        assert set(kept) <= {"mnt.log", "mnt.log.1", "mnt.log.2"}, kept
        for name in kept:
            p = shared / name
            if p.is_symlink():  # the other user's own link, moved along by a rotation's rename
                assert p.lstat().st_uid == 1000 and os.readlink(p) == str(victim), name
                continue
            assert p.stat().st_uid == 0 and p.stat().st_size <= (8 << 20) + 4096, (name, p.stat().st_size)
            assert (p.stat().st_mode & 0o777) == 0o600, name
        # With the other user gone, one more rotation: stderr follows the new live file.
        flood_log(first, 100_000)
        assert os.readlink(f"/proc/{pid}/fd/2") == str(log), "stderr did not follow the live log"
        assert not log.is_symlink() and log.stat().st_size < (8 << 20)
        assert (mnt / first.relative_to(mnt)).read_bytes()  # still serving
        run("umount", mnt)
        deadline = time.monotonic() + 60
        while pathlib.Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pathlib.Path(f"/proc/{pid}").exists(), "the daemon did not end after its unmount"
    finally:
        subprocess.run(["umount", "-l", str(base / "shared" / "mnt")], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
