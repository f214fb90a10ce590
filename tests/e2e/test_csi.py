"""The CSI driver (`loosefs csi` + `loosefs csi-mounter`) driven as the kubelet drives it: a gRPC
client compiled here from the spec's own proto/csi.proto (grpcio-tools) calls the Identity and
Node services over the driver's Unix socket. A fake kubelet directory is laid out as the kubelet
lays it out (root-only, pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount); the mounter runs as
uid 65534 as its container would. A pod's containers are played by a bind mount of the target
read as a non-root user, as the container runtime would give it."""
import contextlib
import hashlib
import importlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from conftest import ROOT, loosefs_bin, missing_prerequisite, need_mount

DRIVER = "csi.loosefs.dev"
MOUNTER_UID = 65534
POD_UID = 1000


@pytest.fixture(scope="module")
def csi():
    """The csi_pb2 / csi_pb2_grpc modules, compiled from proto/csi.proto, and grpc."""
    try:
        import grpc
        from grpc_tools import protoc
    except ImportError:
        missing_prerequisite("grpcio and grpcio-tools are not installed (scripts/python.lock has them)")
    out = tempfile.mkdtemp(prefix="loosefs-csi-proto-")
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", str(ROOT / "proto" / "csi.proto")])
    assert rc == 0, "grpc_tools.protoc failed on proto/csi.proto"
    sys.path.insert(0, out)
    try:
        pb2 = importlib.import_module("csi_pb2")
        pb2_grpc = importlib.import_module("csi_pb2_grpc")
        yield grpc, pb2, pb2_grpc
    finally:
        sys.path.remove(out)
        shutil.rmtree(out, ignore_errors=True)


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def mounts_at(path) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split(" ")[4] == str(path))


class Node:
    """A node with the driver's two processes, a fake kubelet directory and the data."""

    def __init__(self, base: pathlib.Path, csi):
        self.base = base
        self.grpc, self.pb2, self.pb2_grpc = csi
        self.kubelet = base / "kubelet"
        self.kubelet.mkdir(mode=0o750)  # as the kubelet keeps /var/lib/kubelet: root only
        shared = base / "loosefs"  # the pod's emptyDir both containers mount
        shared.mkdir()
        shared.chmod(0o777)
        self.socket = base / "plugin" / "csi.sock"
        self.mounter_socket = shared / "mounter.sock"
        self.work = shared / "volumes"
        self.mounter = None
        self.driver = None

    def start_mounter(self, env=None):
        """The mounter as its container runs it: uid 65534, the environment its manifest gives
        (`env`: credentials for a store) and nothing else."""
        log = open(self.base / "mounter.log", "ab")
        self.mounter_socket.unlink(missing_ok=True)  # a killed mounter's: listening is awaited below
        given = [f"{k}={v}" for k, v in (env or {}).items()]
        self.mounter = subprocess.Popen(
            ["setpriv", f"--reuid={MOUNTER_UID}", f"--regid={MOUNTER_UID}", "--clear-groups",
             "--reset-env", "env", *given, loosefs_bin(), "csi-mounter", "--socket", str(self.mounter_socket)],
            stdout=log, stderr=log)
        wait_for("the mounter to listen", self.mounter_socket.exists, timeout=30)

    def start_driver(self, umask=None, extra=()):
        """The node plugin; `umask`, the one it is started under (its socket is 0600 whatever
        it is); `extra`, more of its flags."""
        log = open(self.base / "driver.log", "ab")
        self.driver = subprocess.Popen(
            [loosefs_bin(), "csi", "--endpoint", f"unix://{self.socket}", "--node-id", "node-1",
             "--mounter", str(self.mounter_socket), "--work-dir", str(self.work),
             "--kubelet-dir", str(self.kubelet), "--publish-timeout", "60", *extra],
            stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info"},
            preexec_fn=None if umask is None else (lambda: os.umask(umask)))
        # The kubelet (grpc-go) sends `:authority: localhost` over a Unix socket; grpc's C core
        # would send the socket's path, which the driver's HTTP/2 server refuses as an authority.
        self.channel = self.grpc.insecure_channel(f"unix://{self.socket}",
                                                  options=[("grpc.default_authority", "localhost")])
        self.grpc.channel_ready_future(self.channel).result(timeout=30)
        self.identity = self.pb2_grpc.IdentityStub(self.channel)
        self.node = self.pb2_grpc.NodeStub(self.channel)

    def kill_driver(self):
        self.channel.close()
        self.driver.send_signal(signal.SIGKILL)
        self.driver.wait(timeout=30)

    def target(self, pv="pv-data") -> pathlib.Path:
        """A pod's target path: its parent exists (the kubelet makes it), `mount` does not."""
        parent = self.kubelet / "pods" / str(uuid.uuid4()) / "volumes" / "kubernetes.io~csi" / pv
        parent.mkdir(parents=True)
        return parent / "mount"

    def capability(self, flags=(), mode=None):
        pb2 = self.pb2
        mode = pb2.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY if mode is None else mode
        return pb2.VolumeCapability(mount=pb2.VolumeCapability.MountVolume(mount_flags=list(flags)),
                                    access_mode=pb2.VolumeCapability.AccessMode(mode=mode))

    def staging(self, volume_id="pv-data") -> pathlib.Path:
        """The volume's staging path, as the kubelet names it (its parent exists)."""
        parent = (self.kubelet / "plugins" / "kubernetes.io" / "csi" / DRIVER
                  / hashlib.sha256(volume_id.encode()).hexdigest())
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "globalmount"

    def context(self, source, context=None) -> dict:
        ctx = {"source": str(source), "csi.storage.k8s.io/pod.name": "train-0",
               "csi.storage.k8s.io/pod.namespace": "default", "csi.storage.k8s.io/ephemeral": "false"}
        ctx.update(context or {})
        return ctx

    def stage(self, source, volume_id="pv-data", flags=(), context=None, secrets=None, **kw):
        """NodeStageVolume as the kubelet calls it (volume_context without the pod's keys)."""
        ctx = {"source": str(source)}
        ctx.update(context or {})
        req = self.pb2.NodeStageVolumeRequest(
            volume_id=volume_id, staging_target_path=str(kw.pop("staging", self.staging(volume_id))),
            volume_capability=kw.pop("capability", self.capability(flags)), volume_context=ctx,
            secrets=secrets or {}, **kw)
        return self.node.NodeStageVolume(req, timeout=120)

    def publish_only(self, target, source, volume_id="pv-data", flags=(), context=None, readonly=True, **kw):
        req = self.pb2.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=str(target), readonly=readonly,
            staging_target_path=str(kw.pop("staging", self.staging(volume_id))),
            volume_capability=kw.pop("capability", self.capability(flags)),
            volume_context=self.context(source, context), **kw)
        return self.node.NodePublishVolume(req, timeout=120)

    def publish(self, target, source, volume_id="pv-data", flags=(), context=None, **kw):
        """A pod's volume mounted as the kubelet does it: NodeStageVolume (once per node; again
        is OK), then NodePublishVolume at the pod's target."""
        self.stage(source, volume_id, flags, context, capability=kw.get("capability", self.capability(flags)))
        return self.publish_only(target, source, volume_id, flags, context, **kw)

    def unpublish(self, target, volume_id="pv-data", unstage=True):
        """NodeUnpublishVolume of `target`, then (`unstage`) NodeUnstageVolume of the volume:
        the kubelet's calls when the volume's last pod on the node ends."""
        self.node.NodeUnpublishVolume(
            self.pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
            timeout=60)
        if unstage:
            self.unstage(volume_id)

    def unstage(self, volume_id="pv-data"):
        return self.node.NodeUnstageVolume(
            self.pb2.NodeUnstageVolumeRequest(volume_id=volume_id,
                                              staging_target_path=str(self.staging(volume_id))),
            timeout=60)

    def records(self) -> list:
        """Root's records of what is staged and published."""
        return sorted(str(p.relative_to(self.work)) for p in (self.work / "state").rglob("*.json"))

    def code_of(self, call) -> tuple:
        with pytest.raises(self.grpc.RpcError) as e:
            call()
        return e.value.code(), e.value.details()

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n" + (self.base / n).read_text(errors="replace")[-3000:]
                         for n in ("driver.log", "mounter.log") if (self.base / n).exists())

    def processes(self) -> dict:
        """{pid: parent pid} of the volumes' processes the mounter runs: each volume's keeper
        (`loosefs mount … /dev/fd/3 --keeper`, the mounter's child) and its daemon (the
        keeper's child, the same command line)."""
        found = {}
        for d in pathlib.Path("/proc").iterdir():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if argv[1:2] == [b"mount"] and b"/dev/fd/3" in argv \
                    and any(a.startswith(str(self.work).encode()) for a in argv):
                found[int(d.name)] = ppid
        return found

    def daemons(self) -> list:
        """The pids of the daemons serving the volumes (their keepers' children)."""
        p = self.processes()
        return sorted(pid for pid, parent in p.items() if parent in p)

    def keepers(self) -> list:
        p = self.processes()
        return sorted(pid for pid, parent in p.items() if parent not in p)


@contextlib.contextmanager
def node_with_driver(csi, pack, mounter_env=None, driver_flags=()):
    """A node: a mounter and a driver (with `driver_flags`) over a work directory in /tmp."""
    need_mount()
    if shutil.which("setpriv") is None:
        missing_prerequisite("setpriv is not installed (util-linux)")
    base = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-csi-", dir="/tmp"))
    base.chmod(0o755)
    n = Node(base, csi)
    data = base / "data.pack"
    shutil.copyfile(pack, data)
    data.chmod(0o644)
    n.data = data
    try:
        n.start_mounter(mounter_env)
        n.start_driver(extra=driver_flags)
        yield n
    finally:
        for p in (n.driver, n.mounter):
            if p and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        with open("/proc/self/mountinfo") as f:
            left = [line.split(" ")[4] for line in f if line.split(" ")[4].startswith(str(base))]
        for m in reversed(left):
            subprocess.run(["umount", "-l", m], timeout=30)
        for pid in n.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


# Prints the sha256 of every file under argv[1] as JSON, {path: digest}.
DIGEST_SCRIPT = ("import hashlib, json, pathlib, sys\n"
                 "r = pathlib.Path(sys.argv[1])\n"
                 "print(json.dumps({str(p.relative_to(r)): hashlib.sha256(p.read_bytes()).hexdigest()"
                 " for p in sorted(r.rglob('*')) if p.is_file() and '.loosefs' not in p.parts}))\n")


def tree_digest_as(uid: int, root) -> dict:
    """sha256 of every file under `root`, read by a process of `uid` (no capability)."""
    out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                          sys.executable, "-c", DIGEST_SCRIPT, str(root)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def pod_reads(n: Node, target) -> dict:
    """sha256 of every file of the volume at `target` as a pod's container reads it: through
    a bind mount (as the container runtime gives it), as a user other than root."""
    view = n.base / "pod-view"
    view.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(target), str(view)], check=True, timeout=30)
    try:
        return tree_digest_as(POD_UID, view)
    finally:
        subprocess.run(["umount", str(view)], check=True, timeout=30)


def test_identity_and_node_info_answer_as_the_kubelet_expects(csi, pack):
    with node_with_driver(csi, pack) as n:
        info = n.identity.GetPluginInfo(n.pb2.GetPluginInfoRequest(), timeout=10)
        assert info.name == DRIVER and info.vendor_version
        caps = n.identity.GetPluginCapabilities(n.pb2.GetPluginCapabilitiesRequest(), timeout=10)
        assert list(caps.capabilities) == []  # node only: no controller service
        assert n.identity.Probe(n.pb2.ProbeRequest(), timeout=10).ready.value is True
        got = n.node.NodeGetInfo(n.pb2.NodeGetInfoRequest(), timeout=10)
        assert got.node_id == "node-1" and got.max_volumes_per_node == 0
        caps = n.node.NodeGetCapabilities(n.pb2.NodeGetCapabilitiesRequest(), timeout=10)
        RPC = n.pb2.NodeServiceCapability.RPC
        got = sorted(c.rpc.type for c in caps.capabilities)
        # One daemon per volume per node (staging), its stats and condition; no expansion.
        assert got == sorted([RPC.STAGE_UNSTAGE_VOLUME, RPC.GET_VOLUME_STATS, RPC.VOLUME_CONDITION]), caps
        code, _ = n.code_of(lambda: n.node.NodeExpandVolume(n.pb2.NodeExpandVolumeRequest(), timeout=10))
        assert code == n.grpc.StatusCode.UNIMPLEMENTED
        # The probe reports the mounter: not ready while none answers, ready again once one does.
        n.mounter.kill()
        n.mounter.wait(timeout=30)
        code, details = n.code_of(lambda: n.identity.Probe(n.pb2.ProbeRequest(), timeout=10))
        assert code == n.grpc.StatusCode.FAILED_PRECONDITION and "mounter" in details, (code, details)
        check = [loosefs_bin(), "csi-mounter", "--check", "--socket", str(n.mounter_socket)]
        as_mounter = ["setpriv", f"--reuid={MOUNTER_UID}", f"--regid={MOUNTER_UID}", "--clear-groups"]
        r = subprocess.run([*as_mounter, *check], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "no loosefs csi-mounter answers" in r.stderr, (r.returncode, r.stderr)
        n.start_mounter()
        assert n.identity.Probe(n.pb2.ProbeRequest(), timeout=10).ready.value is True
        # The mounter container's liveness probe, run as the mounter's user.
        r = subprocess.run([*as_mounter, *check], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        log = (n.base / "mounter.log").read_text()
        assert "refused a request" not in log and "no descriptor" not in log, log


def test_a_pod_reads_its_volume_served_unprivileged_across_a_driver_restart(csi, pack, source):
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    with node_with_driver(csi, pack) as n:
        target = n.target()
        n.publish(target, n.data, flags=["ro"], context={"mountOptions": "threads=2"})
        # A second publish of the same target (the kubelet retries) is OK and mounts nothing more.
        n.publish(target, n.data, flags=["ro"], context={"mountOptions": "threads=2"})
        assert mounts_at(target) == 1, n.logs()
        # The pod's container sees the target through a bind mount; its user is not root.
        assert pod_reads(n, target) == want
        # The node's other users cannot reach it through the host path (the kubelet's directory
        # is root-only), and the mount is read-only.
        other = subprocess.run(["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}",
                                "--clear-groups", "ls", str(target)],
                               capture_output=True, text=True, timeout=30)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
        with open("/proc/self/mountinfo") as f:
            line = next(x for x in f if x.split(" ")[4] == str(target))
        assert "ro" in line.split(" ")[5].split(","), line
        assert "fuse.loosefs loosefs:csi/pv-data" in line, line
        # One daemon, of the mounter's user, without any capability.
        (pid,) = n.daemons()
        fields = dict(x.split(":", 1) for x in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
        assert fields["Uid"].split()[:2] == [str(MOUNTER_UID)] * 2, fields["Uid"]
        assert int(fields["CapEff"].strip(), 16) == 0, fields["CapEff"]
        # The driver is killed and started again: the volume keeps serving, with the same daemon.
        n.kill_driver()
        first = next(p for p in sorted(target.rglob("*")) if p.is_file())
        assert hashlib.sha256(first.read_bytes()).hexdigest() == want[str(first.relative_to(target))]
        n.start_driver()
        n.publish(target, n.data, flags=["ro"], context={"mountOptions": "threads=2"})
        assert mounts_at(target) == 1 and n.daemons() == [pid], n.logs()
        # Unpublished and unstaged (twice: the second finds nothing and is OK): no mount,
        # target, daemon or record is left; the volume's log is kept.
        n.unpublish(target)
        n.unpublish(target)
        assert mounts_at(target) == 0 and not target.exists()
        assert mounts_at(n.staging()) == 0 and not n.staging().exists()
        wait_for("the daemon to end", lambda: not n.daemons(), timeout=30)
        assert n.records() == [], n.records()
        (logs,) = (n.work / "volumes").iterdir()
        assert (logs / "daemon.err").exists(), list(logs.iterdir())


def test_a_daemon_that_died_is_replaced_by_its_keeper_and_the_next_publish_is_ok(csi, pack, source):
    with node_with_driver(csi, pack) as n:
        target = n.target()
        n.publish(target, n.data)
        (pid,) = n.daemons()
        (keeper,) = n.keepers()
        os.kill(pid, signal.SIGKILL)
        wait_for("the daemon to end", lambda: pid not in n.daemons(), timeout=30)
        wait_for("a new daemon", lambda: len(n.daemons()) == 1, timeout=30)
        assert n.keepers() == [keeper]
        n.publish(target, n.data)
        assert mounts_at(target) == 1, n.logs()
        assert len(n.daemons()) == 1 and n.daemons() != [pid] and n.keepers() == [keeper], n.logs()
        some = next(p for p in sorted(source.rglob("*")) if p.is_file())
        assert (target / some.relative_to(source)).read_bytes() == some.read_bytes()
        n.unpublish(target)


def test_a_pod_read_finishes_identical_across_a_mounter_restart(csi, pack, source):
    """The mounter's container restarts (the mounter, every volume's keeper and daemon killed)
    while a pod reads, one READ held inside the daemon (the test hook): the node plugin holds
    the connection, hands it to the new mounter, whose keeper resends the READ to a new
    daemon; the pod's read of every file finishes identical, and nothing is published again."""
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    hold = None
    with node_with_driver(csi, pack) as n:
        shared = n.mounter_socket.parent  # 0777: the mounter's user renames the hook's file
        hold = shared / "hold"
        n.mounter.kill()
        n.mounter.wait(timeout=30)
        n.start_mounter({"LOOSEFS_TEST_HOLD_READ": str(hold)})
        target = n.target()
        n.publish(target, n.data)
        view = n.base / "pod-view"
        view.mkdir()
        subprocess.run(["mount", "--bind", str(target), str(view)], check=True, timeout=30)
        try:
            hold.touch()
            pod = subprocess.Popen(["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups",
                                    sys.executable, "-c", DIGEST_SCRIPT, str(view)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for("a READ held in the daemon", lambda: pathlib.Path(f"{hold}.held").exists(), timeout=60)
            # The container restarts: everything in it is killed, then the mounter starts again.
            before = set(n.processes())
            n.mounter.kill()
            n.mounter.wait(timeout=30)
            for pid in before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_for("the old keepers and daemons to end", lambda: not (set(n.processes()) & before), timeout=30)
            n.start_mounter()
            out, err = pod.communicate(timeout=300)
            assert pod.returncode == 0, err + n.logs()
            assert json.loads(out) == want
        finally:
            subprocess.run(["umount", "-l", str(view)], timeout=30)
        assert len(n.daemons()) == 1 and not (set(n.processes()) & before), n.logs()
        assert "handed to the new mounter" in n.logs(), n.logs()
        n.unpublish(target)
        wait_for("the volume's processes to end", lambda: not n.processes(), timeout=30)


def test_bad_requests_get_their_codes_and_mount_nothing(csi, pack):
    with node_with_driver(csi, pack) as n:
        pb2, INVALID = n.pb2, n.grpc.StatusCode.INVALID_ARGUMENT
        cases = {
            "no volume id": dict(volume_id=""),
            "no source": dict(context={"source": ""}),
            "an unknown option": dict(flags=["wram"]),
            "a bad value": dict(context={"mountOptions": "threads=many"}),
            "an option the driver owns": dict(flags=["log=/etc/passwd"]),
            "a writer access mode": dict(capability=n.capability(
                mode=pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)),
            "a block volume": dict(capability=pb2.VolumeCapability(
                block=pb2.VolumeCapability.BlockVolume(),
                access_mode=pb2.VolumeCapability.AccessMode(
                    mode=pb2.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY))),
        }
        for what, kw in cases.items():
            target = n.target()
            code, details = n.code_of(lambda: n.publish(target, n.data, **kw))
            assert code == INVALID, (what, code, details)
            assert mounts_at(target) == 0 and not target.exists(), what
        code, details = n.code_of(lambda: n.node.NodePublishVolume(pb2.NodePublishVolumeRequest(
            volume_id="pv", target_path=str(n.target())), timeout=30))
        assert code == INVALID and "volume_capability" in details, details
        code, details = n.code_of(lambda: n.publish_only("", n.data))
        assert code == INVALID and "target_path" in details, details
        code, details = n.code_of(lambda: n.stage(n.data, staging=""))
        assert code == INVALID and "staging_target_path" in details, details
        outside = n.base / "elsewhere"
        code, details = n.code_of(lambda: n.publish_only(outside, n.data))
        assert code == INVALID and "kubelet" in details, details
        code, details = n.code_of(lambda: n.stage(n.data, staging=outside))
        assert code == INVALID and "kubelet" in details, details
        assert not outside.exists()
        code, _ = n.code_of(lambda: n.unpublish(n.target(), volume_id=""))
        assert code == INVALID
        assert n.mounter.poll() is None and not n.daemons()


def test_a_source_the_mounter_cannot_read_is_refused_saying_why(csi, pack):
    with node_with_driver(csi, pack) as n:
        secret = n.base / "secret.pack"
        shutil.copyfile(pack, secret)
        secret.chmod(0o600)  # root's only
        target = n.target()
        code, details = n.code_of(lambda: n.publish(target, secret))
        assert code == n.grpc.StatusCode.PERMISSION_DENIED, (code, details, n.logs())
        assert str(secret) in details and "ermission denied" in details, details
        assert mounts_at(target) == 0 and not target.exists()
        missing = n.base / "missing.pack"
        code, details = n.code_of(lambda: n.publish(target, missing))
        assert code == n.grpc.StatusCode.NOT_FOUND and str(missing) in details, (code, details)
        assert mounts_at(target) == 0 and not target.exists()
        # The daemon's exit code gives the status (src/exit_code.rs), never its words.
        noise = n.base / "noise.bin"
        noise.write_bytes(os.urandom(4096))
        noise.chmod(0o644)
        code, details = n.code_of(lambda: n.publish(target, noise, volume_id="pv-noise"))
        assert code == n.grpc.StatusCode.DATA_LOSS and str(noise) in details, (code, details)
        code, details = n.code_of(lambda: n.publish(target, n.data, volume_id="pv-frames",
                                                   flags=["decode=frames"]))
        assert code == n.grpc.StatusCode.INVALID_ARGUMENT and "--decode frames" in details, (code, details)
        assert mounts_at(target) == 0 and not target.exists()
        assert mounts_at(n.staging()) == 0
        wait_for("no daemon left", lambda: not n.daemons(), timeout=30)
        assert n.records() == [], n.records()


def test_a_volume_in_a_bucket_is_read_with_the_mounters_credentials(csi, pack, source, tmp_path_factory):
    """A PV whose source is an s3:// pack on SeaweedFS: its mountOptions reach the daemon
    (endpoint, plain http), the mounter's environment gives the credentials, and a pod user
    reads every file byte-identical."""
    import servers
    need_mount()
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    weed = servers.Seaweed(tmp_path_factory.mktemp("csi-weed"))
    try:
        weed.start()
        weed.put("train.pack", pack)
        env = {"AWS_ACCESS_KEY_ID": servers.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": servers.SECRET_KEY,
               "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", "HOME": "/nonexistent"}
        with node_with_driver(csi, pack, mounter_env=env) as n:
            target = n.target("pv-s3")
            n.publish(target, f"s3://{weed.bucket}/train.pack", volume_id="pv-s3",
                      flags=[f"endpoint-url={weed.endpoint}", "allow-http"])
            assert pod_reads(n, target) == want
            n.unpublish(target, volume_id="pv-s3")
            assert mounts_at(target) == 0
            # Without credentials the mounter's daemon is refused, and the driver says so.
            n.mounter.kill()
            n.mounter.wait(timeout=30)
            n.start_mounter({"AWS_EC2_METADATA_DISABLED": "true", "HOME": "/nonexistent"})
            code, details = n.code_of(lambda: n.publish(target, f"s3://{weed.bucket}/train.pack",
                                                        volume_id="pv-s3",
                                                        flags=[f"endpoint-url={weed.endpoint}", "allow-http"]))
            assert code != n.grpc.StatusCode.OK and "credentials" in details, (code, details)
            assert mounts_at(target) == 0 and not target.exists()
    finally:
        weed.stop()


def test_a_target_through_a_link_is_refused_and_nothing_is_mounted_outside(csi, pack):
    # reliability-probe.md, csi-target-symlink-escape: a target that is a link (out of the
    # kubelet directory, or to another pod's target) or lies under one.
    with node_with_driver(csi, pack) as n:
        INVALID = n.grpc.StatusCode.INVALID_ARGUMENT
        outside = n.base / "outside"
        outside.mkdir()
        other = n.target("pv-other")
        n.publish(other, n.data, volume_id="pv-other")
        link = n.target()
        link.symlink_to(outside)
        to_other = n.target()
        to_other.symlink_to(other)
        under = n.target()
        under.parent.rmdir()
        under.parent.symlink_to(outside)
        for what, target in (("a link out", link), ("a link to another pod's target", to_other),
                             ("under a link", under)):
            code, details = n.code_of(lambda: n.publish(target, n.data))
            assert code == INVALID and "symbolic link" in details, (what, code, details)
            code, _ = n.code_of(lambda: n.unpublish(target))  # refused alike: nothing touched
            assert code == INVALID, what
        assert mounts_at(outside) == 0 and not any(outside.iterdir()), list(outside.iterdir())
        assert mounts_at(other) == 1 and any(other.iterdir()), n.logs()
        n.unpublish(other, volume_id="pv-other")
        assert mounts_at(other) == 0


def test_unpublish_undoes_only_its_own_volume_and_a_target_is_taken_in_canonical_form(csi, pack):
    # reliability-probe.md: csi-unpublish-foreign-mount, csi-target-noncanonical-stack and
    # csi-volume-id-escaped-republish.
    with node_with_driver(csi, pack) as n:
        target = n.target("pv-a")
        n.publish(target, n.data, volume_id="pv-a")
        n.unpublish(target, volume_id="pv-b")  # not pv-b's: OK, pv-a stays
        assert mounts_at(target) == 1 and any(target.iterdir()), n.logs()
        # Given as `T/` and with `//`: the same target, one mount, unpublished by either form.
        n.publish(str(target) + "/", n.data, volume_id="pv-a")
        n.publish(str(target).replace("/volumes/", "//volumes/./"), n.data, volume_id="pv-a")
        assert mounts_at(target) == 1, n.logs()
        n.unpublish(str(target) + "/", volume_id="pv-a")
        assert mounts_at(target) == 0 and not target.exists()
        # A tmpfs the driver never made, at a target under the kubelet directory: left.
        foreign = n.target("pv-tmpfs")
        foreign.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(foreign)], check=True, timeout=30)
        try:
            n.unpublish(foreign, volume_id="pv-tmpfs")
            assert mounts_at(foreign) == 1
        finally:
            subprocess.run(["umount", str(foreign)], timeout=30)
        # Ids the kernel escapes in the mount table (Azure's rg#account#container, `\`, a
        # space): every republish finds its own mount.
        for vid in ("rg#acct#cont", "a\\b", "a\\040b"):
            t = n.target()
            n.publish(t, n.data, volume_id=vid)
            n.publish(t, n.data, volume_id=vid)
            assert mounts_at(t) == 1, (vid, n.logs())
            n.unpublish(t, volume_id=vid)
            assert mounts_at(t) == 0, vid


def test_options_and_sources_cannot_smuggle_what_the_driver_refuses(csi, pack):
    # reliability-probe.md, csi-option-smuggling: `warm=--metrics-addr=…` as a PV mount option
    # or attribute, `-o…` as the source.
    import socket as socket_
    with socket_.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with node_with_driver(csi, pack) as n:
        INVALID = n.grpc.StatusCode.INVALID_ARGUMENT
        for kw in (dict(flags=[f"warm=--metrics-addr=127.0.0.1:{port}"]),
                   dict(context={"mountOptions": f"warm=--metrics-addr=127.0.0.1:{port}"}),
                   dict(flags=["warm=--allow-non-empty"])):
            target = n.target()
            code, details = n.code_of(lambda: n.publish(target, n.data, **kw))
            assert code == INVALID, (kw, code, details)
            assert mounts_at(target) == 0
        target = n.target()
        code, details = n.code_of(lambda: n.publish(
            target, f"-owarm={n.data},metrics_addr=127.0.0.1:{port}"))
        assert code == INVALID and "source" in details, (code, details)
        assert mounts_at(target) == 0 and not n.daemons()
        with socket_.socket() as c:
            assert c.connect_ex(("127.0.0.1", port)) != 0, "a daemon listens where it may not"


def test_the_endpoint_is_roots_alone_and_never_replaces_a_file(csi, pack):
    # reliability-probe.md: csi-endpoint-umask (a driver started under umask 000) and
    # csi-endpoint-deletes-file.
    with node_with_driver(csi, pack) as n:
        n.kill_driver()
        n.start_driver(umask=0)
        assert (n.socket.stat().st_mode & 0o777) == 0o600, oct(n.socket.stat().st_mode)
        probe = ("import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "try:\n"
                 "    s.connect(sys.argv[1]); print('connected')\n"
                 "except OSError as e:\n"
                 "    print('refused', e.errno)\n")
        n.socket.parent.chmod(0o755)
        r = subprocess.run(["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups",
                            sys.executable, "-c", probe, str(n.socket)],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
        keep = n.base / "keep.txt"
        keep.write_text("data")
        r = subprocess.run([loosefs_bin(), "csi", "--endpoint", f"unix://{keep}", "--node-id", "n",
                            "--mounter", str(n.mounter_socket), "--work-dir", str(n.work),
                            "--kubelet-dir", str(n.kubelet)], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and "not a socket" in r.stderr, r.stderr
        assert keep.read_text() == "data"
