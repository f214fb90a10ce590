"""Remote packs against real servers on 127.0.0.1: SeaweedFS (S3, SigV4) and nginx (HTTP and
HTTPS ranges), with the fault proxy of servers.py between loosefs and the server where a test
needs to count requests or inject faults. Every read is compared byte for byte with the
source tree."""
import errno
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import DATA, ROOT, loosefs_bin, missing_prerequisite, need_mount
import servers


def files_of(root: pathlib.Path):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and ".loosefs" not in p.parts)


@pytest.fixture(scope="module")
def world(pack, tmp_path_factory):
    """SeaweedFS with the pack at s3://packs/data.pack, nginx serving it, and a proxy before each."""
    need_mount()
    if shutil.which("nginx") is None:
        pytest.fail("nginx not installed (scripts/setup.sh installs nginx-light)")
    work = tmp_path_factory.mktemp("remote")
    www = work / "www"
    www.mkdir()
    shutil.copy(pack, www / "data.pack")
    weed = servers.Seaweed(work / "weed")
    nginx = servers.Nginx(work / "nginx", www)
    try:
        weed.start()
        nginx.start()
        weed.put("data.pack", pack)
        weed.put("data.pack", pack, bucket=weed.public)
        s3_proxy = servers.FaultProxy(weed.port).start()
        http_proxy = servers.FaultProxy(nginx.port).start()
        yield dict(work=work, www=www, weed=weed, nginx=nginx, s3_proxy=s3_proxy, http_proxy=http_proxy)
    finally:
        weed.stop()
        nginx.stop()


@pytest.fixture(autouse=True)
def faults_cleared(request):
    """Every test starts with both proxies fault-free: faults a failed test left armed never
    reach the next one."""
    if "world" in request.fixturenames:
        w = request.getfixturevalue("world")
        w["s3_proxy"].reset()
        w["http_proxy"].reset()
    yield


def s3_env(secret=servers.SECRET_KEY):
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("AWS_")]:
        del env[k]
    env.update(AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=secret, AWS_EC2_METADATA_DISABLED="true",
               HOME=env.get("HOME", "/root"))
    return env


class Mount:
    def __init__(self, url, work, *args, env=None, check=True):
        self.mnt = work / f"mnt{random.randrange(1 << 30)}"
        self.mnt.mkdir()
        self.log = work / f"{self.mnt.name}.log"
        self.r = subprocess.run([loosefs_bin(), "mount", url, str(self.mnt), "--log", str(self.log), *args],
                                env=env or s3_env(), capture_output=True, text=True, timeout=300)
        if check:
            assert self.r.returncode == 0, self.r.stderr

    def __enter__(self):
        return self.mnt

    def __exit__(self, *a):
        if self.r.returncode == 0:
            subprocess.run([loosefs_bin(), "umount", str(self.mnt)], check=True)


def s3_args(world, proxy=True, cache=None, size="1G"):
    """Through the proxy (or straight to SeaweedFS), with a fresh cache directory. The cache
    size is explicit: the default depends on the machine's free space."""
    port = world["s3_proxy"].port if proxy else world["weed"].port
    return ["--endpoint-url", f"http://127.0.0.1:{port}", "--allow-http", "--cache-size", size,
            "--cache-dir", str(cache or world["work"] / f"cache{random.randrange(1 << 30)}")]


def assert_same_tree(mnt, source):
    a, b = files_of(source), files_of(mnt)
    assert a == b and len(a) > 0
    for rel in a:
        assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel


def test_s3_mount_imagefolder_and_dali_equal_the_local_files(world, source):
    import numpy as np
    import torchvision
    from test_loaders import dali_epoch, rel

    with Mount("s3://packs/data.pack", world["work"], *s3_args(world)) as mnt:
        assert_same_tree(mnt, source)
        a, b = torchvision.datasets.ImageFolder(str(source)), torchvision.datasets.ImageFolder(str(mnt))
        assert b.class_to_idx == a.class_to_idx and rel(b.samples, mnt) == rel(a.samples, source)
        ia, la = dali_epoch(source)
        ib, lb = dali_epoch(mnt)
        assert la == lb and len(la) > 0
        assert all(np.array_equal(x, y) for x, y in zip(ia, ib))


def test_remount_costs_one_request_and_reads_from_the_block_cache(world, source):
    proxy = world["s3_proxy"]
    cache = world["work"] / "cache-remount"
    n0 = proxy.requests
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world, cache=cache)) as mnt:
        assert_same_tree(mnt, source)
    first = proxy.requests - n0
    assert first >= 2, "a cold epoch must have fetched blocks"
    n1 = proxy.requests
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world, cache=cache)) as mnt:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
        assert_same_tree(mnt, source)
    # The tail GET pins the ETag; the index and every block come from the cache.
    assert proxy.requests - n1 == 1, (first, proxy.requests - n1)


def test_https_with_a_private_ca_and_plain_http_only_when_allowed(world, source):
    nginx = world["nginx"]
    cache = ["--cache-dir", str(world["work"] / "cache-https"), "--cache-size", "1G"]
    with Mount(nginx.url("data.pack", tls=True), world["work"], "--ca-bundle", str(nginx.ca), *cache) as mnt:
        assert_same_tree(mnt, source)
    info = subprocess.run([loosefs_bin(), "info", nginx.url("data.pack")], capture_output=True, text=True)
    assert info.returncode != 0 and "--allow-http" in info.stderr
    # An untrusted certificate is refused.
    bad = subprocess.run([loosefs_bin(), "info", nginx.url("data.pack", tls=True), "--retries", "0", *cache],
                         capture_output=True, text=True, env={**os.environ, "AWS_CA_BUNDLE": ""})
    assert bad.returncode != 0 and "certificate" in bad.stderr and "--ca-bundle" in bad.stderr, bad.stderr
    # ... at once with the retries left at their default: no retry heals a certificate. Retried
    # as a connection error, 20 retries back off for minutes (0.1 s doubling to 15 s each).
    listed = world["www"] / "listed" / "tls-check"
    listed.mkdir(parents=True, exist_ok=True)
    (listed / "a.bin").write_bytes(b"x" * 100)
    for url in (nginx.url("data.pack", tls=True), nginx.url("listed/tls-check/", tls=True)):
        bad = subprocess.run([loosefs_bin(), "info", url, "--retries", "20", "--retry-timeout", "600", *cache],
                             capture_output=True, text=True, env={**os.environ, "AWS_CA_BUNDLE": ""}, timeout=60)
        assert bad.returncode != 0 and "certificate" in bad.stderr and "--ca-bundle" in bad.stderr, bad.stderr
        assert bad.stderr.count("UnknownIssuer") <= 2, bad.stderr


def test_info_verify_and_pack_upload_on_urls(world, source):
    b, env = loosefs_bin(), s3_env()
    args = s3_args(world, proxy=False)
    up = subprocess.run([b, "pack", str(source), "s3://packs/uploaded.pack", *args], env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    info = subprocess.run([b, "info", "s3://packs/uploaded.pack", "--json", *args], env=env, capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    import json
    assert json.loads(info.stdout)["samples"] == len(files_of(source))
    v = subprocess.run([b, "verify", "s3://packs/uploaded.pack", "--against", str(source), *args], env=env,
                       capture_output=True, text=True)
    assert v.returncode == 0 and "identical to the source" in v.stdout, v.stdout + v.stderr


def test_wrong_credentials_and_missing_object_fail_the_mount_clearly(world, loose):
    r = Mount("s3://packs/data.pack", world["work"], *s3_args(world, proxy=False), env=s3_env("wrong-secret"), check=False).r
    assert r.returncode != 0 and "access denied (403)" in r.stderr, r.stderr
    r = Mount("s3://packs/missing.pack", world["work"], *s3_args(world, proxy=False), check=False).r
    assert r.returncode != 0 and "no such object (404)" in r.stderr, r.stderr
    # A bucket that does not exist: said in words, not the server's XML.
    r = Mount("s3://nosuchbucket/train/", world["work"], *s3_args(world, proxy=False), "--retries", "0",
              check=False).r
    assert r.returncode != 0 and "<" not in r.stderr, r.stderr
    assert "no such bucket or container: check its name in the URL" in r.stderr, r.stderr
    # A prefix of loose objects given without its trailing `/`: the 404 says what to give.
    r = Mount("s3://packs/loose", world["work"], *s3_args(world, proxy=False), check=False).r
    assert r.returncode != 0 and "give s3://packs/loose/, with its trailing `/`" in r.stderr, r.stderr
    r = Mount(world["nginx"].url("missing.pack"), world["work"], "--allow-http", check=False).r
    assert r.returncode != 0 and "404" in r.stderr, r.stderr


def test_no_sign_request_reads_a_public_bucket(world, source):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    with Mount("s3://public/data.pack", world["work"], *s3_args(world), "--no-sign-request", env=env) as mnt:
        assert_same_tree(mnt, source)
    # The same request to a private bucket is refused.
    r = Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--no-sign-request", env=env, check=False).r
    assert r.returncode != 0 and "403" in r.stderr, r.stderr


def test_connections_cut_mid_answer_are_retried(world, source):
    proxy = world["s3_proxy"]
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--push-ahead", "0") as mnt:
        # The next four new connections are reset after 300 kB of answer. How many new ones the
        # client opens depends on its pool (it reuses live connections, and did so after the
        # third cut over /dev/fuse in a full run): at least one must have been cut, and every
        # byte still matches.
        proxy.set(cut_after=300_000, cuts=4)
        assert_same_tree(mnt, source)
        assert proxy.cuts < 4, "no connection was cut: nothing was retried"


def test_injected_503s_are_retried_and_corrupted_bytes_refetched(world, source):
    proxy = world["s3_proxy"]
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--prefetch-max-mb", "0", "--push-ahead", "0") as mnt:
        # One flipped byte in the middle of the first GET's body (it lands in a sample: the
        # pack is mostly sample bytes and the read order is fixed), and three 503s.
        c0 = proxy.corrupted
        proxy.set(fail_503=3, corrupt=1)
        assert_same_tree(mnt, source)
        assert proxy.fail_503 == 0 and proxy.corrupted - c0 == 1
        log = (world["work"] / f"{mnt.name}.log").read_text()
        assert "fetching it again" in log and "answering EIO" not in log, log[-2000:]


def test_server_down_gives_eio_after_the_retries_and_the_mount_recovers(world, source):
    # The proxy drops every connection and refuses new ones: the server is gone mid-epoch.
    proxy = world["http_proxy"]
    url = f"http://127.0.0.1:{proxy.port}/data.pack"
    files = files_of(source)
    retry = 10
    with Mount(url, world["work"], "--allow-http", "--retry-timeout", str(retry), "--request-timeout", "5",
               "--prefetch-max-mb", "0", "--push-ahead", "0", "--cache-size", "1G",
               "--cache-dir", str(world["work"] / "cache-down")) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        proxy.set(down=True)
        try:
            t = t0 = time.time()
            with pytest.raises(OSError) as e:
                (mnt / files[-1]).read_bytes()
            assert e.value.errno == errno.EIO
            assert time.time() - t < 60
            # Every read fails while the server is gone, at once: the retry time is spent once
            # per outage, not again for every READ (ten reads took ten retry times before).
            t = time.time()
            for rel in files[-12:-2]:
                with pytest.raises(OSError):
                    (mnt / rel).read_bytes()
            assert time.time() - t < retry, time.time() - t
        finally:
            proxy.set(down=False)
        failing = time.time() - t0
        log = (world["work"] / f"{mnt.name}.log").read_text()
        # At most one line per 10 s interval of failures (stats::LogLimit), whatever the count.
        assert 1 <= log.count("answering EIO") <= 2 + int(failing // 10), (failing, log[-3000:])
        assert log.count("failed after its retries") == 1, log[-3000:]
        assert (mnt / files[-1]).read_bytes() == (source / files[-1]).read_bytes()
        assert_same_tree(mnt, source)


def test_server_killed_and_restarted_mid_epoch(world, source):
    # nginx itself is killed (SIGKILL) after part of an epoch, then started again.
    nginx = world["nginx"]
    files = files_of(source)
    half = len(files) // 2
    with Mount(nginx.url("data.pack"), world["work"], "--allow-http", "--retries", "1", "--retry-timeout", "3",
               "--prefetch-max-mb", "0", "--push-ahead", "0", "--cache-size", "1G",
               "--cache-dir", str(world["work"] / "cache-kill")) as mnt:
        for rel in files[:half]:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes()
        os.killpg(nginx.proc.pid, 9)
        nginx.proc.wait()
        try:
            with pytest.raises(OSError) as e:
                (mnt / files[-1]).read_bytes()
            assert e.value.errno == errno.EIO
        finally:
            nginx.start()
        for rel in files:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel


def test_offline_mounts_a_complete_clean_cache_without_a_request(world, source):
    """`--offline`: no cache of the URL, or a partial one, is refused saying why; a cache
    warmed whole and closed cleanly mounts with the server gone, makes no request, serves the
    same tree and says so in stats."""
    import json

    proxy = world["http_proxy"]
    url = f"http://127.0.0.1:{proxy.port}/data.pack"
    args = ["--allow-http", "--cache-size", "1G", "--cache-dir", str(world["work"] / "cache-offline")]
    r = Mount(url, world["work"], *args, "--offline", check=False).r
    assert r.returncode == 69 and "holds no block cache" in r.stderr, r.stderr  # unavailable offline
    files = files_of(source)
    with Mount(url, world["work"], *args, "--prefetch-max-mb", "0", "--push-ahead", "0") as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
    r = Mount(url, world["work"], *args, "--offline", check=False).r
    assert r.returncode == 69 and "not complete" in r.stderr, r.stderr
    with Mount(url, world["work"], *args) as mnt:
        subprocess.run([loosefs_bin(), "warm", str(mnt), "--wait"], check=True, timeout=300)
    n = proxy.requests
    proxy.set(down=True)
    try:
        with Mount(url, world["work"], *args, "--offline") as mnt:
            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
            assert_same_tree(mnt, source)
            st = json.loads(subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True,
                                           text=True, check=True).stdout)
            assert st["remote"]["offline"] is True and st["remote"]["gets"] == 0, st["remote"]
    finally:
        proxy.set(down=False)
    assert proxy.requests == n
    # The offline mount closed cleanly too: the next one mounts again.
    with Mount(url, world["work"], *args, "--offline") as mnt:
        assert (mnt / files[-1]).read_bytes() == (source / files[-1]).read_bytes()


def test_profile_file_credentials(world, source, tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n"
                     f"[bench]\naws_access_key_id = {servers.ACCESS_KEY}\naws_secret_access_key = {servers.SECRET_KEY}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    args = s3_args(world, proxy=False)
    ok = subprocess.run([loosefs_bin(), "info", "s3://packs/data.pack", "--profile", "bench", *args], env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([loosefs_bin(), "info", "s3://packs/data.pack", *args], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "403" in bad.stderr, bad.stderr
    none = subprocess.run([loosefs_bin(), "info", "s3://packs/data.pack", *args],
                          env={**env, "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}, capture_output=True, text=True)
    assert none.returncode != 0 and "no AWS credentials" in none.stderr, none.stderr
    assert "credential_process" in none.stderr and "--no-sign-request" in none.stderr, none.stderr


def credential_process_env(tmp_path, profile: str, script: str) -> dict:
    """The environment of a profile `profile` whose credentials come from `credential_process`
    = a shell script of `script` (its body) in `tmp_path`; no other AWS source is reachable."""
    helper = tmp_path / f"{profile}.sh"
    helper.write_text("#!/bin/sh\n" + script)
    helper.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(f"[profile {profile}]\ncredential_process = {helper}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    return env


def test_a_credential_process_profile_mounts_and_runs_its_command_once(world, source, tmp_path):
    """A profile whose credentials come from `credential_process` (the AWS CLI's external
    source, found by aws-config's chain): the mount reads every file byte-identical, and the
    command runs once for the whole mount (its credentials carry no expiry), not per request."""
    runs = tmp_path / "runs"
    env = credential_process_env(tmp_path, "proc",
                                 f"echo run >> {runs}\n"
                                 f"echo '{{\"Version\": 1, \"AccessKeyId\": \"{servers.ACCESS_KEY}\", "
                                 f"\"SecretAccessKey\": \"{servers.SECRET_KEY}\"}}'\n")
    with Mount("s3://packs/data.pack", world["work"], "--profile", "proc", *s3_args(world), env=env) as mnt:
        files = files_of(source)
        assert files_of(mnt) == files
        for rel in files:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
    assert runs.read_text().count("run") == 1, runs.read_text()


def test_credentials_near_their_expiry_are_fetched_again_once(world, source, tmp_path):
    """Credentials whose Expiration comes within five minutes are fetched again before the next
    request, once: the first answer of the `credential_process` expires in 5 min 20 s (20 s
    for the mount and three reads before they enter their last five minutes: a loaded machine
    is not a failure), the next in 2 h. Reads before and after the refresh are byte-identical;
    the command ran twice."""
    runs = tmp_path / "runs"
    keys = f"\"AccessKeyId\": \"{servers.ACCESS_KEY}\", \"SecretAccessKey\": \"{servers.SECRET_KEY}\""
    env = credential_process_env(tmp_path, "soon",
                                 f"if [ -f {runs} ]; then exp=$(date -u -d '+2 hours' +%Y-%m-%dT%H:%M:%SZ)\n"
                                 f"else exp=$(date -u -d '+320 seconds' +%Y-%m-%dT%H:%M:%SZ); fi\n"
                                 f"echo run >> {runs}\n"
                                 f"echo \"{{\\\"Version\\\": 1, {keys.replace(chr(34), chr(92) + chr(34))}, "
                                 f"\\\"Expiration\\\": \\\"$exp\\\"}}\"\n")
    files = files_of(source)
    proxy = world["s3_proxy"]
    with Mount("s3://packs/data.pack", world["work"], "--profile", "soon", "--push-ahead", "0",
               *s3_args(world), env=env) as mnt:
        for rel in files[:3]:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        assert runs.read_text().count("run") == 1, runs.read_text()
        # The clock is what is tested: the first credentials enter their last five minutes.
        time.sleep(max(0.0, runs.stat().st_mtime + 21 - time.time()))
        r0 = proxy.requests
        for rel in files[3:]:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        assert proxy.requests > r0, "no request after the credentials neared their expiry"
    assert runs.read_text().count("run") == 2, runs.read_text()


def test_a_credential_process_that_never_answers_fails_the_mount_saying_so(world, tmp_path):
    """A `credential_process` that waits for ever (an MFA prompt with no terminal): the mount
    fails within the credential timeout (30 s) plus its retries' slack, naming the cause,
    instead of hanging; no daemon is left."""
    pid = tmp_path / "helper.pid"
    env = credential_process_env(tmp_path, "hang", f"echo $$ > {pid}\nexec sleep 3600\n")
    t0 = time.monotonic()
    try:
        m = Mount("s3://packs/data.pack", world["work"], "--profile", "hang", *s3_args(world), env=env, check=False)
    finally:
        # The helper outlives the daemon that gave up on it (aws-config leaves its child running).
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    took = time.monotonic() - t0
    assert m.r.returncode != 0 and "credentials" in m.r.stderr and "30 s" in m.r.stderr, m.r.stderr
    assert took < 200, took
    assert not os.path.ismount(m.mnt)


def test_fully_cached_pack_pins_and_decodes_like_a_local_one(world, source, pack, tmp_path):
    import numpy as np
    files = [f for f in files_of(source) if f.suffix == ".JPEG"][:20]
    local = tmp_path / "local"
    local.mkdir()
    subprocess.run([loosefs_bin(), "mount", str(pack), str(local), "--decode", "npy"], check=True)
    try:
        with Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--pin", "all", "--wait",
                   "--decode", "npy") as mnt:
            stats = subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True, check=True)
            import json
            st = json.loads(stats.stdout)
            assert st["daemon"]["locked_bytes"] >= pack.stat().st_size * 0.9, st["daemon"]
            assert st["remote"]["cached_bytes"] >= pack.stat().st_size, st["remote"]
            for rel in files:
                npy = rel.with_suffix(".npy")
                assert np.array_equal(np.load(mnt / npy), np.load(local / npy)), rel
                assert (mnt / rel).read_bytes() == (source / rel).read_bytes()
    finally:
        subprocess.run([loosefs_bin(), "umount", str(local)], check=True)


def test_cache_root_keeps_within_its_size_across_objects(world, source, pack):
    www = world["www"]
    shutil.copy(pack, www / "second.pack")
    cache = world["work"] / "cache-shared"
    size = pack.stat().st_size
    budget = int(size * 1.5)
    a = ["--allow-http", "--cache-dir", str(cache), "--cache-size", str(budget)]
    with Mount(world["nginx"].url("data.pack"), world["work"], *a) as mnt:
        assert_same_tree(mnt, source)
    with Mount(world["nginx"].url("second.pack"), world["work"], *a) as mnt:
        assert_same_tree(mnt, source)
    dirs = [d for d in cache.iterdir() if d.is_dir()]
    held = sum(f.stat().st_blocks * 512 for d in dirs for f in d.iterdir())
    assert len(dirs) == 1 and held <= budget, (dirs, held, budget)


def test_two_live_mounts_sharing_a_cache_root_keep_within_its_size(world, source, pack):
    # Two objects mounted at once on one root: the second takes what the first's share leaves,
    # so both warmed whole still hold no more than --cache-size (a block's rounding aside).
    www = world["www"]
    shutil.copy(pack, www / "third.pack")
    cache = world["work"] / f"cache-live{random.randrange(1 << 30)}"
    size = pack.stat().st_size
    budget = int(size * 1.5)
    a = ["--allow-http", "--cache-dir", str(cache), "--cache-size", str(budget), "--warm", "--wait"]
    with Mount(world["nginx"].url("data.pack"), world["work"], *a) as m1:
        with Mount(world["nginx"].url("third.pack"), world["work"], *a) as m2:
            assert_same_tree(m1, source)
            assert_same_tree(m2, source)
            held = sum(f.stat().st_blocks * 512 for d in cache.iterdir() if d.is_dir() for f in d.iterdir())
            assert held <= budget + (8 << 20), (held, budget)


def replace_object(path: pathlib.Path, pack: pathlib.Path):
    """Puts a new version of `pack` at `path`: same size, one byte changed, a new mtime (so
    nginx's ETag changes)."""
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 1
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.utime(tmp, (time.time() + 5, time.time() + 5))
    os.replace(tmp, path)


def stats_of(mnt: pathlib.Path) -> dict:
    import json
    return json.loads((mnt / ".loosefs" / "stats").read_text())


@pytest.mark.parametrize("if_match", ["honoured", "ignored"])
def test_replaced_object_gives_estale_never_mixed_bytes(world, source, pack, if_match):
    """Over nginx, which honours If-Match (412), and through the proxy with If-Match taken out
    of each request, as a server that ignores it (the answer then carries the new version's
    bytes and ETag: compared with the pin, never served)."""
    www, proxy = world["www"], world["http_proxy"]
    name = f"replaced-{if_match}.pack"
    shutil.copy(pack, www / name)
    files = files_of(source)
    url = f"http://127.0.0.1:{proxy.port}/{name}"
    m = Mount(url, world["work"], "--allow-http", "--prefetch-max-mb", "0",
              "--push-ahead", "0", "--cache-size", "1G", "--cache-dir", str(world["work"] / f"cache-{name}"))
    with m as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        proxy.set(strip_if_match=if_match == "ignored")
        replace_object(www / name, pack)
        with pytest.raises(OSError) as e:
            (mnt / files[-1]).read_bytes()
        assert e.value.errno == errno.ESTALE, e.value
        # What was cached still serves the version that was mounted.
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        s = stats_of(mnt)
        assert s["stale"] >= 1 and s["errors"] >= s["stale"], s
    log = m.log.read_text()
    assert "REPLACED" in log and "ESTALE" in log, log[-2000:]


def test_s3_object_replaced_gives_estale(world, source, pack, tmp_path):
    weed = world["weed"]
    weed.put("replaced.pack", pack)
    files = files_of(source)
    with Mount("s3://packs/replaced.pack", world["work"], *s3_args(world), "--prefetch-max-mb", "0",
               "--push-ahead", "0") as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        other = tmp_path / "other.pack"
        data = bytearray(pack.read_bytes())
        data[len(data) // 2] ^= 1
        other.write_bytes(data)
        weed.put("replaced.pack", other)
        with pytest.raises(OSError) as e:
            (mnt / files[-1]).read_bytes()
        assert e.value.errno == errno.ESTALE, e.value
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        assert stats_of(mnt)["stale"] >= 1
        log = (world["work"] / f"{mnt.name}.log").read_text()
        assert "REPLACED" in log


def flip_block(data: pathlib.Path, block: int):
    """Damages cached block `block` (1 MiB): one byte in every 16 KiB."""
    with open(data, "r+b") as f:
        for k in range(64):
            f.seek(block * (1 << 20) + k * 16384 + 777)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x5A]))


def test_damaged_cache_blocks_are_fetched_again(world, source):
    cache = world["work"] / "cache-damaged"
    args = s3_args(world, cache=cache)
    with Mount("s3://packs/data.pack", world["work"], *args) as mnt:
        assert_same_tree(mnt, source)
    obj = next(d for d in cache.iterdir() if d.is_dir())
    assert (obj / "clean").exists(), "a clean unmount marks the cache clean"
    # A crash: the marker is gone and a block's bytes differ from its table entry.
    (obj / "clean").unlink()
    flip_block(obj / "data", 5)
    proxy = world["s3_proxy"]
    n = proxy.requests
    m = Mount("s3://packs/data.pack", world["work"], *args)
    with m as mnt:
        assert_same_tree(mnt, source)
        import json
        st = json.loads(subprocess.run([loosefs_bin(), "stats", str(mnt), "--json"], capture_output=True, text=True,
                                       check=True).stdout)
        assert st["remote"]["blocks_damaged"] == 1, st["remote"]
    # Independent of the daemon's counter: the proxy saw the tail GET and one refetch of the
    # 1 MiB block, and the log names the block once.
    assert proxy.requests - n == 2, proxy.requests - n
    assert m.log.read_text().count("cached block 5 is damaged") == 1
    # Damage after a clean close (bit rot): the samples' CRC-32 catch it and the blocks are
    # fetched again.
    flip_block(obj / "data", 7)
    m = Mount("s3://packs/data.pack", world["work"], *args)
    with m as mnt:
        assert_same_tree(mnt, source)
    log = m.log.read_text()
    assert "fetching it again" in log and "answering EIO" not in log, log[-3000:]


def test_cache_size_is_respected(world, source, pack):
    cache = world["work"] / "cache-small"
    limit = 40 << 20
    assert pack.stat().st_size > 2 * limit
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world, cache=cache, size="40M"),
               "--prefetch-max-mb", "8") as mnt:
        assert_same_tree(mnt, source)
    data = next(cache.glob("*/data"))
    assert data.stat().st_blocks * 512 <= limit + (1 << 20), data.stat().st_blocks * 512


def test_warm_downloads_once_then_a_shuffled_epoch_makes_no_request(world, source):
    proxy = world["s3_proxy"]
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--warm", "--wait") as mnt:
        n = proxy.requests
        files = files_of(source)
        random.Random(7).shuffle(files)
        for rel in files:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        assert proxy.requests == n


def test_max_requests_bounds_the_requests_in_flight(world, source):
    # Each request waits 20 ms in the proxy, so a warm keeps many in flight if it may. The
    # proxy counts requests forwarded and not yet answered, independently of the daemon.
    proxy = world["s3_proxy"]
    seen = {}
    for limit in (2, 8):
        proxy.set(latency=0.02, max_active=0)
        with Mount("s3://packs/data.pack", world["work"], *s3_args(world),
                   "--max-requests", str(limit), "--warm", "--wait") as mnt:
            assert_same_tree(mnt, source)
        seen[limit] = proxy.max_active
    assert 1 <= seen[2] <= 2, seen
    assert seen[8] > 2, seen  # the counter sees concurrency when it is allowed


def test_region_is_used_for_signing(world, source):
    # The region goes into every SigV4 credential scope; SeaweedFS checks the signature with
    # the region the scope names, so a mount given one still reads every byte.
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world), "--region", "eu-west-3") as mnt:
        assert_same_tree(mnt, source)


def epoch_through_outage(mnt, source, files, proxy, secs):
    """Takes the proxy down, reads `files` through `mnt` in a thread, checks the epoch has not
    ended after `secs` seconds of outage, brings the proxy back; once the epoch ends, returns
    the files read wrong and the errors met."""
    errors, done = [], threading.Event()
    proxy.set(down=True)

    def epoch():
        try:
            for rel in files:
                if (mnt / rel).read_bytes() != (source / rel).read_bytes():
                    errors.append(f"{rel}: wrong bytes")
        except OSError as e:
            errors.append(f"{e}")
        finally:
            done.set()

    threading.Thread(target=epoch, daemon=True).start()
    try:
        assert not done.wait(secs), f"the epoch ended during the outage: {errors}"
    finally:
        proxy.set(down=False)
    assert done.wait(300), "the epoch did not finish after the outage"
    return errors


def test_a_20_s_outage_with_default_options_gives_no_eio(world, source):
    # Connections refused and open ones dropped for 20 s mid-epoch: readers wait through the
    # retries (default --retry-timeout 120 s) and get every byte; none sees EIO. The 20 s is
    # the length of the outage under test, not a wait for something to happen.
    proxy = world["http_proxy"]
    url = f"http://127.0.0.1:{proxy.port}/data.pack"
    files = files_of(source)
    with Mount(url, world["work"], "--allow-http", "--cache-size", "1G",
               "--cache-dir", str(world["work"] / f"cache-outage{random.randrange(1 << 30)}")) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        errors = epoch_through_outage(mnt, source, files[1:], proxy, 20)
        assert errors == [], errors[:5]
        log = (world["work"] / f"{mnt.name}.log").read_text()
        assert "answering EIO" not in log, log[-2000:]


def test_a_rank_announcing_an_eighth_of_the_samples_receives_about_an_eighth_of_the_bytes(world, source,
                                                                                        monkeypatch):
    # A DistributedSampler rank of 8: every 8th file of a shuffled epoch, announced before it
    # is read. The samples are fetched as exact ranges, not as the 1 MiB blocks around them
    # (which would be ~97% of the pack), and read byte for byte.
    sys.path.insert(0, str(ROOT / "python"))
    import loosefs

    monkeypatch.setenv("LOOSEFS_BIN", loosefs_bin())

    files = files_of(source)
    random.Random(11).shuffle(files)
    mine = files[::8]
    own = sum((source / rel).stat().st_size for rel in mine)
    with Mount("s3://packs/data.pack", world["work"], *s3_args(world)) as mnt:
        before = loosefs.stats(mnt).raw["remote"]["bytes_received"]
        assert loosefs.announce_order(mnt, mine) == len(mine)
        for rel in mine:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        remote = loosefs.stats(mnt).raw["remote"]
    got = remote["bytes_received"] - before
    assert remote["exact_gets"] > 0, remote
    assert got <= 1.3 * own, (got, own, remote)


@pytest.mark.parametrize("transport", ["uring", "classic"])
def test_a_read_waiting_for_the_network_stalls_no_other_request_from_its_cpu(world, source, transport):
    """The kernel queues a request on its caller's CPU's ring queue until one of that queue's
    entries is free: with one entry per queue (`--threads 2` on two CPUs did that) one READ
    waiting for a GET held every other request from that CPU. Both readers run on CPU 0; the
    second is answered while the first's GET is still held at the proxy."""
    if transport == "uring" and not pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists():
        pytest.fail("this kernel has no FUSE over io_uring") if os.environ.get("CI") == "true" else pytest.skip(
            "no FUSE over io_uring")
    proxy = world["http_proxy"]
    url = f"http://127.0.0.1:{proxy.port}/data.pack"
    files = sorted(files_of(source), key=lambda rel: (source / rel).stat().st_size)
    small, other = files[0], files[1]
    with Mount(url, world["work"], "--allow-http", "--transport", transport, "--threads", "2",
               "--prefetch-max-mb", "0", "--push-ahead", "0", "--cache-size", "1G",
               "--cache-dir", str(world["work"] / f"cache-slow-{transport}")) as mnt:
        assert stats_of(mnt)["daemon"]["transport"]["kind"] == transport
        proxy.set(hold=True)
        slow = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c",
                                 f"import sys; sys.exit(open({str(mnt / small)!r}, 'rb').read() != "
                                 f"open({str(source / small)!r}, 'rb').read())"])
        try:
            deadline = time.monotonic() + 60
            while proxy.held == 0 and time.monotonic() < deadline and slow.poll() is None:
                time.sleep(0.01)
            assert proxy.held >= 1, "the slow read never reached the server"
            # From the same CPU: the stats, a listing and the attributes of another file, all
            # answered by the daemon from memory.
            quick = subprocess.run(
                ["taskset", "-c", "0", sys.executable, "-c",
                 f"import os; open({str(mnt / '.loosefs/stats')!r}, 'rb').read(); "
                 f"os.listdir({str(mnt / other.parent)!r}); os.stat({str(mnt / other)!r})"],
                timeout=120)
            assert quick.returncode == 0
            assert proxy.held >= 1, "the slow read finished first: nothing was shown"
        finally:
            proxy.set(hold=False)
            assert slow.wait(120) == 0
        assert (mnt / other).read_bytes() == (source / other).read_bytes()


@pytest.fixture(scope="module")
def loose(world, source):
    """The source tree uploaded once as loose objects under s3://packs/loose/; its URL."""
    weed = world["weed"]
    c = weed.client()
    for rel in files_of(source):
        c.upload_file(str(source / rel), weed.bucket, f"loose/{rel.as_posix()}")
    return f"s3://{weed.bucket}/loose/"


def test_loose_objects_under_an_s3_prefix_mount_from_their_listing_and_read_identical(world, source, loose):
    """The source tree uploaded as 1,000 loose objects: `info` and `mount` of the prefix make
    LISTs only (no object is fetched to mount); every file reads identical to the source, each
    object fetched once; an object replaced while mounted answers ESTALE for itself only."""
    weed, proxy = world["weed"], world["s3_proxy"]
    files = files_of(source)
    c = weed.client()
    url = loose
    r0 = proxy.requests
    info = subprocess.run([loosefs_bin(), "info", url, *s3_args(world)], env=s3_env(), capture_output=True,
                          text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "loose objects" in info.stdout and f"samples:       {len(files)} " in info.stdout, info.stdout
    # A LIST of the first level (1,000 class directories), then one of the first 1,000 keys.
    listed = proxy.requests - r0
    assert 2 <= listed <= 3, f"{listed} requests to list {len(files)} keys"
    r0, b0 = proxy.requests, proxy.body_bytes
    with Mount(url, world["work"], *s3_args(world)) as mnt:
        assert proxy.requests - r0 == listed, "the mount fetched objects"
        # Counted in bytes too: the LISTs' XML (under 1 KiB a key), no object's body.
        # ... and more than 100 bytes a key (a LIST entry's XML is ~250): an answer the proxy
        # failed to count (chunked) cannot pass as "nothing downloaded".
        assert 100 * len(files) < proxy.body_bytes - b0 < 1024 * len(files), \
            f"{proxy.body_bytes - b0} bytes received at mount"
        assert files_of(mnt) == files
        # Each file's mtime is its LastModified.
        head = c.head_object(Bucket=weed.bucket, Key=f"loose/{files[0].as_posix()}")
        assert abs((mnt / files[0]).stat().st_mtime - head["LastModified"].timestamp()) < 1
        # Replaced while mounted, before it was read: that file answers ESTALE (a file read
        # before keeps serving the version it was pinned to, from the block cache).
        victim = files[-1]
        c.put_object(Bucket=weed.bucket, Key=f"loose/{victim.as_posix()}", Body=b"new bytes")
        with pytest.raises(OSError) as e:
            (mnt / victim).read_bytes()
        assert e.value.errno == errno.ESTALE
        r1 = proxy.requests
        for rel in files[:-1]:
            assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        gets = proxy.requests - r1
        assert gets <= len(files) * 1.05, f"{gets} requests for {len(files)} objects"
        c.upload_file(str(source / victim), weed.bucket, f"loose/{victim.as_posix()}")


def test_a_kept_prefix_mount_survives_its_daemon_killed_and_reuses_its_block_cache(world, source, loose, tmp_path):
    """The 1,000 loose objects under an S3 prefix, read once while the daemon is killed three
    times between reads and once with a READ held inside it: every file identical, no error,
    and the bytes fetched from SeaweedFS (counted by the proxy) at most 1.1× the data: each new
    daemon lists the prefix again and reads what the dead one cached from the block cache.

    What a kill wastes besides is what its daemon had in flight: read-ahead GETs cut with it
    (the proxy counts their bodies as they start) and bodies received but not yet in the cache.
    With the default read-ahead that was 1.13–1.42× the data on a loaded machine (CI=true, both
    cores busy), 1.014× on an idle one. Read-ahead is off here (`--prefetch-max-mb 0`), and
    every kill falls between two reads or before the held READ's fetch, so nothing is in flight
    and the figure measures the block cache's reuse alone."""
    from test_keeper import Reader, crcs, hold_then_kill, kill_daemon
    proxy = world["s3_proxy"]
    files = files_of(source)
    data = sum((source / rel).stat().st_size for rel in files)
    env = dict(s3_env(), LOOSEFS_TEST_HOLD_READ=str(tmp_path / "hold"))
    b0 = proxy.body_bytes
    with Mount(loose, world["work"], "--push-ahead", "0", "--prefetch-max-mb", "0", *s3_args(world), env=env) as mnt:
        killed = []
        inflight = []

        def kill():
            inflight.append((proxy.active, proxy.body_bytes - b0))
            kill_daemon(mnt)

        before = {n * len(files) // 5: kill for n in (1, 2, 4)}
        before[3 * len(files) // 5] = lambda: hold_then_kill(mnt, tmp_path, killed)
        reader = Reader(mnt, files, crcs(source, files), before=before, direct=True).start()
        reader.join()
        assert reader.errors == [] and reader.wrong == [], (reader.errors[:5], reader.wrong[:5])
        d = stats_of(mnt)["daemon"]
        assert d["keeper"]["restarts"] == 4 and len(killed) == 1, d
    fetched = proxy.body_bytes - b0
    print(f"fetched {fetched} bytes for {data} bytes of files ({fetched / data:.3f}x); "
          f"GETs in flight and bytes fetched at each kill: {inflight}")
    assert fetched <= 1.1 * data, f"{fetched} bytes fetched for {data} bytes of files"


@pytest.fixture(scope="module")
def wds_shards(world, source):
    """The source tree written by webdataset's own ShardWriter (~40 MB shards) and uploaded
    under s3://packs/wds-all/: a packed format as large as the tree; (URL, shard bytes)."""
    import webdataset as wds

    out = world["work"] / "wds-all"
    out.mkdir()
    files = files_of(source)
    label = {c: i for i, c in enumerate(sorted({rel.parent.name for rel in files}))}
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=40e6, verbose=0) as w:
        for i, rel in enumerate(files):
            w.write({"__key__": f"{i:06d}", "jpg": (source / rel).read_bytes(), "cls": label[rel.parent.name]})
    weed = world["weed"]
    total = 0
    for shard in sorted(out.iterdir()):
        weed.put(f"wds-all/{shard.name}", shard)
        total += shard.stat().st_size
    return f"s3://{weed.bucket}/wds-all/", total


@pytest.mark.parametrize("kind", ["pack", "loose", "webdataset"])
def test_a_cold_remote_pass_receives_each_stored_byte_about_once(world, source, loose, wds_shards, kind):
    """Counted by the proxy (response bodies), not by the daemon: a cold mount and one pass
    over every file receive between 0.9x and 1.1x the bytes served (plus the index or
    listing). A loose prefix's mount downloads no object (its listing only); a pack's, its
    index and tail only."""
    proxy = world["s3_proxy"]
    url = {"pack": "s3://packs/data.pack", "loose": loose, "webdataset": wds_shards[0]}[kind]
    b0 = proxy.body_bytes
    with Mount(url, world["work"], *s3_args(world)) as mnt:
        at_mount = proxy.body_bytes - b0
        files = files_of(mnt)
        b1 = proxy.body_bytes
        served = sum(len((mnt / rel).read_bytes()) for rel in files)
        in_pass = proxy.body_bytes - b1
    total = at_mount + in_pass
    print(f"{kind}: {at_mount} bytes received at mount, {in_pass} in the pass, {served} served: {total / served:.3f}x")
    assert served >= 50e6, f"only {served} bytes served: the source must hold at least 50 MB"
    if kind == "loose":
        # The LISTs' XML: well under 1 KiB per key, and over 100 bytes (counted, not missed).
        assert 100 * len(files) < at_mount < 1024 * len(files), \
            f"{at_mount} bytes received at mount for {len(files)} keys"
    if kind == "pack":
        index = len(json.dumps([str(f) for f in files])) * 4 + (1 << 20)
        assert at_mount < index, f"{at_mount} bytes received at mount (index and tail only)"
    # What is stored beyond the files' bytes: a tar's headers and padding (~1 KiB a member),
    # a pack's index and alignment, a listing's XML.
    slack = 2048 * len(files) + (4 << 20)
    assert total <= served * 1.1 + slack, f"{kind}: {total} bytes received for {served} served ({total / served:.2f}x)"
    assert total >= served * 0.9, f"{kind}: {total} bytes received for {served} served ({total / served:.2f}x)"


@pytest.mark.parametrize("kind", ["pack", "webdataset"])
def test_frames_of_a_remote_pack_or_packed_format_are_refused_naming_the_view_and_the_kind(world, wds_shards, kind):
    """`--decode frames` of a remote pack or a remote packed format: refused, naming the view,
    the URL and its kind (it mounted without frames, silently)."""
    url = {"pack": "s3://packs/data.pack", "webdataset": wds_shards[0]}[kind]
    m = Mount(url, world["work"], "--decode", "frames", *s3_args(world), check=False)
    want = {"pack": "is a remote loosefs pack", "webdataset": "is a remote dataset packed as tar"}[kind]
    assert m.r.returncode != 0 and "--decode frames" in m.r.stderr and want in m.r.stderr, m.r.stderr
    assert not os.path.ismount(m.mnt)


LEROBOT = DATA / "lerobot" / "so100-av1"


def test_a_lerobot_dataset_as_loose_objects_reads_identical_and_its_videos_decode_the_same(world):
    """A LeRobot v3 dataset (written by lerobot's own writer: `meta/`, `data/*.parquet`, AV1
    `videos/*.mp4`) uploaded as loose objects: the mount makes LISTs only, every file reads
    byte-identical, and PyAV decodes every frame of every video through the mount as it does
    from the local directory (what `LeRobotDataset(root=MNT)`'s pyav backend reads); with
    `--decode frames` every frame and column file equals the local directory's."""
    import numpy as np
    try:
        import av
    except ImportError:
        missing_prerequisite("PyAV (`av`) is not installed (scripts/python-env.sh installs it)")
    if not LEROBOT.is_dir():
        missing_prerequisite(f"{LEROBOT} is missing")
    weed, proxy = world["weed"], world["s3_proxy"]
    c = weed.client()
    files = files_of(LEROBOT)
    for rel in files:
        c.upload_file(str(LEROBOT / rel), weed.bucket, f"lerobot/{rel.as_posix()}")

    def frames(path):
        with av.open(str(path)) as v:
            return [f.to_ndarray(format="rgb24") for f in v.decode(v.streams.video[0])]

    r0 = proxy.requests
    with Mount(f"s3://{weed.bucket}/lerobot/", world["work"], *s3_args(world)) as mnt:
        assert proxy.requests - r0 <= 3, "the mount fetched objects"
        assert files_of(mnt) == files
        for rel in files:
            assert (mnt / rel).read_bytes() == (LEROBOT / rel).read_bytes(), rel
        videos = [f for f in files if f.suffix == ".mp4"]
        assert len(videos) >= 2, videos
        for rel in videos:
            got, want = frames(mnt / rel), frames(LEROBOT / rel)
            assert len(got) == len(want) > 0, rel
            assert all(np.array_equal(a, b) for a, b in zip(got, want)), rel
    # With --decode frames the prefix shows the same frame and column files as a mount of the
    # local directory, byte for byte (the videos fetched once through the block cache).
    local = world["work"] / f"lerobot-local-{random.randrange(1 << 30)}"
    local.mkdir()
    subprocess.run([loosefs_bin(), "mount", str(LEROBOT), str(local), "--decode", "frames"], check=True,
                   capture_output=True, timeout=300)
    try:
        cache = world["work"] / f"cache-frames-{random.randrange(1 << 30)}"
        # A FIFO planted as a left spool's lock (reliability-probe.md: it wedged this mount,
        # whose cache budget opened every lock there): the mount goes on and leaves it.
        planted = cache / ".frames-planted"
        planted.mkdir(parents=True, mode=0o700)
        cache.chmod(0o700)
        os.mkfifo(planted / "lock")
        with Mount(f"s3://{weed.bucket}/lerobot/", world["work"], "--decode", "frames", *s3_args(world, cache=cache)) as mnt:
            spools = [p for p in cache.iterdir() if p.name.startswith(".frames-") and p != planted]
            assert len(spools) == 1
            # Owner-only, as the block cache beside it: the copies were fetched with credentials.
            assert spools[0].stat().st_mode & 0o777 == 0o700, oct(spools[0].stat().st_mode)
            made = [f for f in files_of(local)
                    if f.parts[0] in ("frames", "columns") or (len(f.parts) > 1 and f.parts[-2].endswith(".frames"))]
            assert len(made) > 1000, len(made)
            assert files_of(mnt) == files_of(local)
            for rel in made:
                assert (mnt / rel).read_bytes() == (local / rel).read_bytes(), rel
        # The copies of the videos go with the mount.
        assert not [p for p in cache.iterdir() if p.name.startswith(".frames-") and p != planted]
    finally:
        subprocess.run([loosefs_bin(), "umount", str(local)], check=True, timeout=60)


def test_a_shared_listing_mounts_a_prefix_with_two_requests_and_a_stale_one_is_refused(world, source, loose):
    """`loosefs index` of a prefix of loose objects writes its listing beside the data; a
    mount then makes two requests (a LIST of the first level, a GET of the index) and serves
    the same tree byte-identical; an object added at the first level makes the index stale
    (refused, naming it) until `loosefs index` runs again, or a mount with `--refresh` lists it
    afresh and writes the listing back."""
    weed, proxy = world["weed"], world["s3_proxy"]
    c = weed.client()
    files = files_of(source)

    def run(*args):
        return subprocess.run([loosefs_bin(), *args, *s3_args(world)], env=s3_env(), capture_output=True,
                              text=True, timeout=300)

    done = run("index", loose)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{loose}.loosefs-index: shared listing of {loose} ({len(files)} objects"), \
        done.stdout
    try:
        r0 = proxy.requests
        info = run("info", loose)
        assert info.returncode == 0, info.stderr
        assert f"a GET of the shared index {loose}.loosefs-index" in info.stdout, info.stdout
        assert proxy.requests - r0 == 2, f"{proxy.requests - r0} requests for info"
        r0 = proxy.requests
        with Mount(loose, world["work"], *s3_args(world)) as mnt:
            assert proxy.requests - r0 == 2, f"{proxy.requests - r0} requests to mount"
            assert files_of(mnt) == files
            for rel in files[:100]:
                assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        c.put_object(Bucket=weed.bucket, Key="loose/added.txt", Body=b"new")
        try:
            never = world["work"] / "never"
            never.mkdir(exist_ok=True)
            refused = run("mount", loose, str(never))
            assert refused.returncode != 0
            assert f"is stale: {loose}added.txt was added since it was indexed" in refused.stderr, refused.stderr
            assert f"run `loosefs index {loose}` again" in refused.stderr, refused.stderr
            # --refresh lists the prefix again, serves the added object and writes the listing
            # back: the next mount takes it with two requests, without --refresh.
            with Mount(loose, world["work"], "--refresh", *s3_args(world)) as mnt:
                assert (mnt / "added.txt").read_bytes() == b"new"
                assert files_of(mnt) == sorted([*files, pathlib.Path("added.txt")])
            r0 = proxy.requests
            with Mount(loose, world["work"], *s3_args(world)) as mnt:
                assert proxy.requests - r0 == 2, f"{proxy.requests - r0} requests to mount"
                assert (mnt / "added.txt").read_bytes() == b"new"
        finally:
            c.delete_object(Bucket=weed.bucket, Key="loose/added.txt")
    finally:
        c.delete_object(Bucket=weed.bucket, Key="loose/.loosefs-index")



def test_an_https_directory_nginx_lists_mounts_as_files_pinned_to_their_dates(world, source, tmp_path):
    """The source tree in a directory nginx lists (`autoindex_format json`): mounting it over
    HTTPS makes one GET per directory (and one asking for a shared listing), no object GET;
    every file reads identical, with its date as mtime; a file rewritten while mounted (same
    size, a later date) answers ESTALE for itself only. A directory with no listing is refused
    naming both ways to serve it; with a shared listing published beside it, it mounts from
    that alone."""
    nginx, proxy, www = world["nginx"], world["http_proxy"], world["www"]
    files = files_of(source)
    tree = www / "listed" / "loose"
    if not tree.exists():
        shutil.copytree(source, tree)
    dirs = {f.parent for f in files} - {pathlib.Path(".")}
    url = nginx.url("listed/loose/", tls=True)
    tls = ["--ca-bundle", str(nginx.ca), "--cache-size", "1G"]
    cache = lambda: ["--cache-dir", str(tmp_path / f"cache{random.randrange(1 << 30)}")]
    info = subprocess.run([loosefs_bin(), "info", url, *tls, *cache()], capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "loose objects" in info.stdout and f"samples:       {len(files)} " in info.stdout, info.stdout
    # Through the proxy (plain HTTP) to count the requests of a mount.
    plain = f"http://127.0.0.1:{proxy.port}/listed/loose/"
    r0 = proxy.requests
    with Mount(plain, world["work"], "--allow-http", "--cache-size", "1G", *cache()) as mnt:
        assert proxy.requests - r0 == 1 + len(dirs) + 1, f"{proxy.requests - r0} requests for {len(dirs)} dirs"
        assert files_of(mnt) == files
    with Mount(url, world["work"], *tls, *cache()) as mnt:
        assert files_of(mnt) == files
        assert int((mnt / files[0]).stat().st_mtime) == int((tree / files[0]).stat().st_mtime)
        victim = tree / files[-1]
        old = victim.read_bytes()
        try:
            victim.write_bytes(bytes(len(old)))
            os.utime(victim, (time.time() + 10, time.time() + 10))
            with pytest.raises(OSError) as e:
                (mnt / files[-1]).read_bytes()
            assert e.value.errno == errno.ESTALE
            for rel in files[:-1]:
                assert (mnt / rel).read_bytes() == (source / rel).read_bytes(), rel
        finally:
            shutil.copy2(source / files[-1], victim)
    # A directory nginx does not list (403): refused, saying how to serve it.
    hidden = www / "unlisted"
    if not hidden.exists():
        shutil.copytree(source, hidden)
    hidden_url = nginx.url("unlisted/", tls=True)
    r = Mount(hidden_url, world["work"], *tls, *cache(), check=False).r
    assert r.returncode != 0
    assert "autoindex_format json" in r.stderr and "loosefs index" in r.stderr, r.stderr
    # Its shared listing, made where the tree is listed and published beside it: the mount
    # reads that alone and serves the same tree.
    made = subprocess.run([loosefs_bin(), "index", url, "--out", str(hidden / ".loosefs-index"), *tls, *cache()],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    plain = f"http://127.0.0.1:{proxy.port}/unlisted/"
    r0 = proxy.requests
    with Mount(plain, world["work"], "--allow-http", "--cache-size", "1G", *cache()) as mnt:
        assert proxy.requests - r0 == 2, f"{proxy.requests - r0} requests (a refused listing, the index)"
        assert_same_tree(mnt, source)


def test_ten_thousand_keys_in_a_hundred_prefixes_are_listed_in_runs_at_once(world):
    """10,000 keys in 100 subdirectories (and objects between them at the first level): the
    mount lists the first level, the first 1,000 keys, then the rest in 16 runs at once, and
    shows every key once, with its bytes."""
    from concurrent.futures import ThreadPoolExecutor
    weed, proxy = world["weed"], world["s3_proxy"]
    c = weed.client()
    keys = [f"many/d{k % 100:03d}/f{k:05d}" for k in range(10_000)] + [f"many/d{k:03d}x" for k in range(0, 100, 7)]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda k: c.put_object(Bucket=weed.bucket, Key=k, Body=k.encode()), keys))
    want = sorted(k[len("many/"):] for k in keys)
    r0 = proxy.requests
    with Mount(f"s3://{weed.bucket}/many/", world["work"], *s3_args(world)) as mnt:
        mounted = proxy.requests - r0
        # The first level, the first page, then per run two LISTs and about one per 1,000 keys.
        assert mounted <= 2 + 2 * 16 + 10 + 2, f"{mounted} requests to list {len(keys)} keys"
        got = sorted(p.relative_to(mnt).as_posix() for p in mnt.rglob("*") if p.is_file())
        assert got == want
        for rel in want[::97]:
            assert (mnt / rel).read_bytes() == f"many/{rel}".encode(), rel


def test_an_outage_mid_epoch_over_loose_objects_gives_no_eio(world, source, loose):
    """Connections to S3 refused and open ones dropped for 5 s mid-epoch over a prefix of loose
    objects: readers wait through the retries (default --retry-timeout 120 s) and get every
    byte; none sees EIO, and no object is taken for gone. The 5 s is the length of the outage
    under test, not a wait for something to happen."""
    proxy = world["s3_proxy"]
    files = files_of(source)
    with Mount(loose, world["work"], *s3_args(world)) as mnt:
        assert (mnt / files[0]).read_bytes() == (source / files[0]).read_bytes()
        errors = epoch_through_outage(mnt, source, files[1:], proxy, 5)
        assert errors == [], errors[:5]
        log = (world["work"] / f"{mnt.name}.log").read_text()
        assert "answering EIO" not in log and "not served" not in log, log[-2000:]


def test_a_prefix_of_loose_objects_packs_as_its_synced_directory_does(world, source, loose, tmp_path):
    """`loosefs pack s3://B/P/ OUT` packs straight from the bucket: the pack is byte-identical
    to the pack of the same objects synced to a local directory (files with their
    LastModified as mtime, as `aws s3 sync` leaves them; each directory with the newest of what
    it holds, as the mount shows it)."""
    weed = world["weed"]
    c = weed.client()
    synced = tmp_path / "synced"
    newest = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=weed.bucket, Prefix="loose/"):
        for o in page.get("Contents", []):
            rel = pathlib.PurePosixPath(o["Key"][len("loose/"):])
            if rel.name.startswith("."):
                continue
            dest = synced / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            c.download_file(weed.bucket, o["Key"], str(dest))
            t = int(o["LastModified"].timestamp())
            os.chmod(dest, 0o644)
            os.utime(dest, (t, t))
            for d in [*rel.parents]:
                newest[d] = max(newest.get(d, 0), t)
    for d, t in sorted(newest.items(), key=lambda x: -len(x[0].parts)):
        os.chmod(synced / d, 0o755)
        os.utime(synced / d, (t, t))
    local = subprocess.run([loosefs_bin(), "pack", str(synced), str(tmp_path / "local.pack")],
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    remote = subprocess.run([loosefs_bin(), "pack", loose, str(tmp_path / "remote.pack"), *s3_args(world)],
                            env=s3_env(), capture_output=True, text=True, timeout=300)
    assert remote.returncode == 0, remote.stderr
    a, b = (tmp_path / "local.pack").read_bytes(), (tmp_path / "remote.pack").read_bytes()
    assert len(a) == len(b) and a == b, f"{len(a)} and {len(b)} bytes differ"


def test_loose_jpegs_under_a_prefix_show_decoded_views_from_a_head_range_each(world, source, loose):
    """`--decode npy` over loose objects: each JPEG's dimensions come from a ranged GET of its
    head at mount (the objects themselves are not downloaded), and its .npy equals Pillow's
    decode."""
    import numpy as np
    from PIL import Image

    proxy = world["s3_proxy"]
    files = [f for f in files_of(source) if f.suffix.lower() in (".jpeg", ".jpg")][:40]
    r0 = proxy.requests
    with Mount(loose, world["work"], "--decode", "npy", *s3_args(world)) as mnt:
        # One LIST, a GET of each JPEG's first 8 KiB, and a second of up to 256 KiB where
        # the frame header lies further in (EXIF thumbnails): no object fetched whole.
        mounted = proxy.requests - r0
        assert mounted <= 2 * len(files_of(source)) + 3, f"{mounted} requests to mount"
        for rel in files:
            with Image.open(source / rel) as im:
                ref = np.asarray(im.convert("RGB"))
            a = np.load(mnt / rel.with_suffix(".npy"))
            assert a.shape == ref.shape and np.array_equal(a, ref), rel


def test_the_fault_proxy_counts_the_bodies_of_every_framing():
    """The byte-count tests read `FaultProxy.body_bytes`: a chunked answer counts its payload
    (it counted 0), a HEAD's answer none (its Content-Length mis-framed what followed on the
    connection), and answers read to the close count too."""
    import http.client
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()

        def do_GET(self):
            if self.path == "/chunked":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in (b"a" * 300, b"b" * 4000, b"c" * 7):
                    self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\nX-Trailer: t\r\n\r\n")
            elif self.path == "/close":
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"z" * 500)
                self.close_connection = True
            else:
                self.send_response(200)
                self.send_header("Content-Length", "123")
                self.end_headers()
                self.wfile.write(b"f" * 123)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = servers.FaultProxy(server.server_address[1]).start()
    try:
        c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        for method, path, size in (("HEAD", "/x", 0), ("GET", "/chunked", 4307), ("GET", "/fixed", 123),
                                   ("HEAD", "/x", 0), ("GET", "/fixed", 123)):
            c.request(method, path)
            assert len(c.getresponse().read()) == size, (method, path)
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        c.request("GET", "/close")
        assert len(c.getresponse().read()) == 500
        c.close()
        deadline = time.monotonic() + 30
        while proxy.body_bytes < 4307 + 123 * 2 + 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.body_bytes == 4307 + 123 * 2 + 500, proxy.body_bytes
        assert proxy.requests == 6
    finally:
        proxy.stop()
        server.shutdown()
