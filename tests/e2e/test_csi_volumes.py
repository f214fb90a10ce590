"""The CSI driver's volumes as a node's pods share them, the kubelet played over gRPC as in
test_csi.py: one daemon per volume per node (NodeStageVolume) bound into each pod's target,
the volume's block cache kept across its pods and its unstage (a remote prefix counted by a
proxy), a volume's own Secret reaching its daemon alone, IRSA against moto's STS, a volume
whose daemon is gone reported abnormal, and the spec's edge cases answered with their codes."""
import hashlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from conftest import loosefs_bin, need_mount
from test_csi import (DIGEST_SCRIPT, MOUNTER_UID, POD_UID, csi, mounts_at, node_with_driver,  # noqa: F401
                      pod_reads, wait_for)

NO_CREDENTIALS = {"AWS_EC2_METADATA_DISABLED": "true", "HOME": "/nonexistent", "AWS_REGION": "us-east-1"}


def digests(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def reads_as(uid: int, n, target) -> subprocess.Popen:
    """A pod's container reading every file of `target` through a bind mount of its own, as
    user `uid`: started, not waited for."""
    view = n.base / f"pod-view-{uuid.uuid4().hex[:8]}"
    view.mkdir()
    subprocess.run(["mount", "--bind", str(target), str(view)], check=True, timeout=30)
    p = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                          sys.executable, "-c", DIGEST_SCRIPT, str(view)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.view = view
    return p


def finished(p: subprocess.Popen) -> dict:
    import json
    out, err = p.communicate(timeout=600)
    subprocess.run(["umount", "-l", str(p.view)], timeout=30)
    assert p.returncode == 0, err
    return json.loads(out)


def test_one_daemon_serves_two_pods_and_a_prefix_is_downloaded_once(csi, pack, source, tmp_path_factory):
    """Two pods on one node claim one volume of 1,000 loose objects under an S3 prefix
    (SeaweedFS behind a counting proxy): one stage, two binds, one daemon; both pods' users read
    every file identical at once, and the bytes downloaded are the data's once. One pod ends:
    the other still reads; the unstage is refused until the last pod is gone, then nothing is
    left but the log and the cache. A pod that comes back is served by a new daemon from the
    kept block cache: the listing is downloaded again, no object."""
    import servers
    need_mount()
    want = digests(source)
    data = sum((source / f).stat().st_size for f in want)
    weed = servers.Seaweed(tmp_path_factory.mktemp("csi-shared-weed"))
    proxy = None
    try:
        weed.start()
        c = weed.client()
        for rel in want:
            c.upload_file(str(source / rel), weed.bucket, f"loose/{rel}")
        proxy = servers.FaultProxy(weed.port).start()
        env = dict(NO_CREDENTIALS, AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY)
        url = f"s3://{weed.bucket}/loose/"
        flags = [f"endpoint-url=http://127.0.0.1:{proxy.port}", "allow-http"]
        # The default cache bound leaves 20 % of the disk free: on a machine whose disk is
        # fuller than that (CI's was, at 18 %) it is the smallest cache and nothing is kept.
        # What is checked here is the keeping, so the margin is the machine's free space.
        keep = ("--cache-keep-free", "0")
        with node_with_driver(csi, pack, mounter_env=env, driver_flags=keep) as n:
            FAILED = n.grpc.StatusCode.FAILED_PRECONDITION
            b0 = proxy.body_bytes
            n.stage(url, "pv-s3", flags)
            n.stage(url, "pv-s3", flags)  # the kubelet retries: OK, nothing more
            t1, t2 = n.target("pv-s3"), n.target("pv-s3")
            n.publish_only(t1, url, "pv-s3", flags)
            n.publish_only(t2, url, "pv-s3", flags)
            assert len(n.daemons()) == 1 and len(n.keepers()) == 1, n.logs()
            for t in (t1, t2):
                with open("/proc/self/mountinfo") as f:
                    line = next(x for x in f if x.split(" ")[4] == str(t))
                assert "ro" in line.split(" ")[5].split(",") and "loosefs:csi/pv-s3" in line, line
            pods = [reads_as(POD_UID, n, t1), reads_as(POD_UID + 1, n, t2)]
            assert [finished(p) for p in pods] == [want, want], n.logs()
            fetched = proxy.body_bytes - b0
            print(f"two pods read {data} bytes of files; {fetched} bytes downloaded ({fetched / data:.3f}x)")
            assert fetched <= 1.1 * data, f"{fetched} bytes downloaded for {data} bytes of files"
            code, details = n.code_of(lambda: n.unstage("pv-s3"))
            assert code == FAILED and str(t1) in details and str(t2) in details, (code, details)
            n.unpublish(t1, "pv-s3", unstage=False)
            assert mounts_at(t1) == 0 and not t1.exists()
            some = sorted(want)[len(want) // 2]
            assert hashlib.sha256((t2 / some).read_bytes()).hexdigest() == want[some]
            code, details = n.code_of(lambda: n.unstage("pv-s3"))
            assert code == FAILED and str(t2) in details, (code, details)
            n.unpublish(t2, "pv-s3")
            assert mounts_at(n.staging("pv-s3")) == 0 and n.records() == [], n.records()
            wait_for("the volume's daemon to end", lambda: not n.processes(), timeout=30)
            assert len(list((n.work / "caches").iterdir())) == 1, "the block cache is kept"
            # The pod comes back: a new stage, a new daemon, the kept cache.
            b1 = proxy.body_bytes
            t3 = n.target("pv-s3")
            n.publish(t3, url, "pv-s3", flags)
            assert pod_reads(n, t3) == want
            again = proxy.body_bytes - b1
            print(f"after the unstage, a new daemon served the pod with {again} bytes downloaded "
                  f"({again / data:.3f}x the data: the listing)")
            assert again <= 0.05 * data, f"{again} bytes downloaded again for {data} bytes of files"
            n.unpublish(t3, "pv-s3")
    finally:
        if proxy:
            proxy.stop()
        weed.stop()


def test_a_volumes_secret_reaches_its_daemon_and_nowhere_else(csi, pack, source, tmp_path_factory):
    """A PV whose nodeStageSecretRef gives S3 keys (moto, which takes any key pair), the mounter
    holding none: the pod reads every file identical; the secret is in its daemon's environment
    and in no log, command line, `stats`, metrics or file of the work directory. Without the
    Secret the same volume is refused for want of credentials."""
    import servers
    need_mount()
    want = digests(source)
    moto = servers.Moto(tmp_path_factory.mktemp("csi-moto")).start()
    secret = f"csi-secret-{uuid.uuid4().hex}"
    try:
        moto.client().upload_file(str(pack), moto.bucket, "train.pack")
        url = f"s3://{moto.bucket}/train.pack"
        flags = [f"endpoint-url={moto.endpoint}", "allow-http"]
        with node_with_driver(csi, pack, mounter_env=NO_CREDENTIALS) as n:
            target = n.target("pv-secret")
            code, details = n.code_of(lambda: n.publish(target, url, "pv-secret", flags))
            assert code != n.grpc.StatusCode.OK and "credentials" in details, (code, details)
            keys = {"aws_access_key_id": "AKIDLOOSEFSCSI", "aws_secret_access_key": secret}
            n.stage(url, "pv-secret", flags, secrets=keys)
            n.publish_only(target, url, "pv-secret", flags)
            assert pod_reads(n, target) == want
            (pid,) = n.daemons()
            assert secret.encode() in pathlib.Path(f"/proc/{pid}/environ").read_bytes()
            staging = n.staging("pv-secret")
            shown = {
                "stats": subprocess.run([loosefs_bin(), "stats", str(staging), "--json"], capture_output=True,
                                        text=True, timeout=60).stdout,
                "metrics": (staging / ".loosefs" / "metrics").read_text(),
                "ps": subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, timeout=60).stdout,
            }
            assert shown["stats"] and shown["metrics"], shown
            for f in [n.base / "driver.log", n.base / "mounter.log", *n.work.rglob("*")]:
                if f.is_file():
                    shown[str(f)] = f.read_bytes().decode(errors="replace")
            assert [k for k, text in shown.items() if secret in text] == [], "the secret is shown"
            n.unpublish(target, "pv-secret")
            # A key the driver does not know is named, its value never.
            code, details = n.code_of(lambda: n.stage(url, "pv-bad", flags, secrets={"password": secret}))
            assert code == n.grpc.StatusCode.INVALID_ARGUMENT and "password" in details and secret not in details
            assert secret not in (n.base / "driver.log").read_text(errors="replace")
    finally:
        moto.stop()


def test_irsa_reads_a_bucket_with_no_static_key(csi, pack, source, tmp_path_factory):
    """IRSA as EKS sets it up: the mounter's ServiceAccount token projected into a file, and
    `AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE` in its environment, no key anywhere. The
    daemon's credential chain exchanges the token with STS (moto's AssumeRoleWithWebIdentity,
    through `AWS_ENDPOINT_URL_STS`) and the pod reads every file identical; without the token
    the same volume is refused for want of credentials."""
    import servers
    need_mount()
    want = digests(source)
    work = tmp_path_factory.mktemp("csi-irsa")
    moto = servers.Moto(work / "moto").start()
    try:
        moto.client().upload_file(str(pack), moto.bucket, "train.pack")
        irsa = dict(NO_CREDENTIALS, AWS_ROLE_ARN="arn:aws:iam::123456789012:role/loosefs-datasets",
                    AWS_ROLE_SESSION_NAME="loosefs-csi", AWS_ENDPOINT_URL_STS=moto.endpoint)
        url = f"s3://{moto.bucket}/train.pack"
        flags = [f"endpoint-url={moto.endpoint}", "allow-http"]
        with node_with_driver(csi, pack, mounter_env=irsa) as n:
            # The projected token, as the kubelet writes it: readable by the mounter's user.
            token = n.base / "token"
            token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bG9vc2Vmcy1jc2kifQ.c2ln")
            token.chmod(0o644)
            target = n.target("pv-irsa")
            code, details = n.code_of(lambda: n.publish(target, url, "pv-irsa", flags))
            assert code != n.grpc.StatusCode.OK and "credentials" in details, (code, details)
            n.mounter.kill()
            n.mounter.wait(timeout=30)
            n.start_mounter(dict(irsa, AWS_WEB_IDENTITY_TOKEN_FILE=str(token)))
            n.publish(target, url, "pv-irsa", flags)
            assert pod_reads(n, target) == want
            (pid,) = n.daemons()
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not any(v.startswith(b"AWS_ACCESS_KEY_ID=") for v in environ)
            n.unpublish(target, "pv-irsa")
    finally:
        moto.stop()


def scrape(port: int) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
        return r.read().decode()


def test_a_volume_whose_daemon_is_gone_is_reported_abnormal_with_the_reason(csi, pack):
    """NodeGetVolumeStats says a served volume's usage and a normal condition; once its keeper
    and daemon are gone (and no mounter takes it over), an abnormal condition with the reason
    and where its log is. The node's one metrics port shows each volume's families labelled
    with its id, and `loosefs_csi_volume_up` 1 then 0."""
    with node_with_driver(csi, pack) as n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        n.kill_driver()
        n.start_driver(extra=["--metrics-addr", f"127.0.0.1:{port}"])
        target = n.target()
        n.publish(target, n.data)
        text = scrape(port)
        assert 'loosefs_csi_volume_up{volume="pv-data"} 1' in text, text
        assert [line for line in text.splitlines() if line.startswith("loosefs_") and 'volume="pv-data"' in line
                and "mountpoint=" in line], text
        families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        assert len(families) == len(set(families)), "a family typed twice"
        for path in (target, n.staging()):
            r = n.node.NodeGetVolumeStats(n.pb2.NodeGetVolumeStatsRequest(
                volume_id="pv-data", volume_path=str(path)), timeout=30)
            assert not r.volume_condition.abnormal, r
            total = {u.unit: u.total for u in r.usage}
            assert total[n.pb2.VolumeUsage.BYTES] > 0 and total[n.pb2.VolumeUsage.INODES] > 0, r
        # The keeper and its daemon are gone and no mounter takes the volume over.
        for pid in n.keepers() + n.daemons():
            os.kill(pid, signal.SIGKILL)
        wait_for("the volume's processes to end", lambda: not n.processes(), timeout=30)
        r = n.node.NodeGetVolumeStats(n.pb2.NodeGetVolumeStatsRequest(
            volume_id="pv-data", volume_path=str(target)), timeout=30)
        assert r.volume_condition.abnormal, r
        msg = r.volume_condition.message
        # ENOTCONN once the kernel has aborted the connection, ECONNABORTED before (the keeper's
        # last descriptor closing races the check).
        assert "not served" in msg and ("ENOTCONN" in msg or "ECONNABORTED" in msg) and "daemon.log" in msg, msg
        assert 'loosefs_csi_volume_up{volume="pv-data"} 0' in scrape(port)
        code, _ = n.code_of(lambda: n.node.NodeGetVolumeStats(n.pb2.NodeGetVolumeStatsRequest(
            volume_id="pv-other", volume_path=str(target)), timeout=30))
        assert code == n.grpc.StatusCode.NOT_FOUND
        n.unpublish(target)
        assert mounts_at(target) == 0 and mounts_at(n.staging()) == 0


def test_the_specs_edge_cases_answer_their_codes(csi, pack):
    with node_with_driver(csi, pack) as n:
        S = n.grpc.StatusCode
        # Published before it is staged: FAILED_PRECONDITION.
        code, details = n.code_of(lambda: n.publish_only(n.target("pv-a"), n.data, "pv-a"))
        assert code == S.FAILED_PRECONDITION and "NodeStageVolume" in details, (code, details)
        n.stage(n.data, "pv-a")
        # Staged again with other options: ALREADY_EXISTS; with the same: OK.
        code, details = n.code_of(lambda: n.stage(n.data, "pv-a", ["threads=2"]))
        assert code == S.ALREADY_EXISTS and "threads" in details, (code, details)
        n.stage(n.data, "pv-a")
        t = n.target("pv-a")
        n.publish_only(t, n.data, "pv-a")
        # The same target with the other `readonly`: ALREADY_EXISTS; as before: OK.
        code, details = n.code_of(lambda: n.publish_only(t, n.data, "pv-a", readonly=False))
        assert code == S.ALREADY_EXISTS and "readonly" in details, (code, details)
        n.publish_only(t, n.data, "pv-a")
        # readonly=false with a reader-only access mode: published, read-only as the mode says.
        rw = n.target("pv-a")
        n.publish_only(rw, n.data, "pv-a", readonly=False)
        with open("/proc/self/mountinfo") as f:
            line = next(x for x in f if x.split(" ")[4] == str(rw))
        assert "ro" in line.split(" ")[5].split(","), line
        # A publish asking other options than its stage: FAILED_PRECONDITION.
        code, details = n.code_of(lambda: n.publish_only(n.target("pv-a"), n.data, "pv-a", ["threads=2"]))
        assert code == S.FAILED_PRECONDITION and "threads" in details, (code, details)
        # Another volume at a target that holds pv-a: ALREADY_EXISTS, pv-a untouched.
        n.stage(n.data, "pv-b")
        code, details = n.code_of(lambda: n.publish_only(t, n.data, "pv-b"))
        assert code == S.ALREADY_EXISTS and "loosefs:csi/pv-a" in details, (code, details)
        assert mounts_at(t) == 1 and any(t.iterdir())
        # Unknown volume_context keys, an inline ephemeral volume, a Secret's unknown key:
        # INVALID_ARGUMENT naming them.
        for what, kw, named in (
                ("a typo", dict(context={"mountOption": "warm"}), "mountOption"),
                ("an inline volume", dict(context={"csi.storage.k8s.io/ephemeral": "true"}), "ephemeral"),
                ("a secret's key", dict(secrets={"aws_secret_key": "x"}), "aws_secret_key")):
            code, details = n.code_of(lambda: n.stage(n.data, "pv-c", **kw))
            assert code == S.INVALID_ARGUMENT and named in details, (what, code, details)
        code, details = n.code_of(lambda: n.publish_only(n.target("pv-a"), n.data, "pv-a",
                                                         context={"csi.storage.k8s.io/ephemeral": "true"}))
        assert code == S.INVALID_ARGUMENT and "ephemeral" in details, (code, details)
        assert mounts_at(n.staging("pv-c")) == 0
        # Concurrent calls on one volume: ABORTED while its stage works (its daemon waits on a
        # store that never answers), for a second stage and for a publish.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = "s3://never/answers.pack"
        flags = [f"endpoint-url=http://127.0.0.1:{silent.getsockname()[1]}", "allow-http"]
        keys = {"aws_access_key_id": "AKID", "aws_secret_access_key": "s"}
        before = set(n.daemons())
        first = {}
        stager = threading.Thread(target=lambda: first.update(code=n.code_of(
            lambda: n.stage(url, "pv-slow", flags, secrets=keys))[0]))
        stager.start()
        try:
            wait_for("the slow volume's daemon", lambda: set(n.daemons()) - before, timeout=60)
            code, details = n.code_of(lambda: n.stage(url, "pv-slow", flags, secrets=keys))
            assert code == S.ABORTED and "retry" in details, (code, details)
            code, details = n.code_of(lambda: n.publish_only(n.target("pv-slow"), url, "pv-slow", flags))
            assert code == S.ABORTED, (code, details)
        finally:
            for pid in set(n.keepers()) | set(n.daemons()):
                # A daemon may end with its keeper, killed an instant before: gone is fine.
                try:
                    argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"never/answers" in argv:
                        os.kill(pid, signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError):
                    pass
            stager.join(timeout=120)
            silent.close()
        assert first.get("code") not in (None, S.OK), first
        assert mounts_at(n.staging("pv-slow")) == 0
        # Unstaged while a pod holds it: FAILED_PRECONDITION naming the targets.
        code, details = n.code_of(lambda: n.unstage("pv-a"))
        assert code == S.FAILED_PRECONDITION and str(t) in details, (code, details)
        for target in (t, rw):
            n.unpublish(target, "pv-a", unstage=False)
        n.unstage("pv-a")
        n.unstage("pv-b")
        assert mounts_at(n.staging("pv-a")) == 0 and n.records() == [], n.records()
