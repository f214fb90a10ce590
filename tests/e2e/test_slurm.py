"""The Slurm recipe in deploy/slurm/ on a one-node Slurm cluster started here (munged,
slurmctld and slurmd from Debian's slurm-wlm, on free ports, in a temporary directory): a job
that names its dataset (`--comment=loosefs:SOURCE`) finds it mounted by the root Prolog at
/mnt/loosefs/$SLURM_JOB_ID and reads it byte for byte as its own unprivileged user; the daemon
serving it runs as that user with no capability; another user of the node is refused the mount;
a dataset the job's user cannot read (a root-only 0600 pack) is not mounted, saying why; the
Epilog leaves no mount behind; the block cache of a remote dataset is on the node's own disk
(the site's `cache_root`), the site's credentials reach the job's daemon alone (from a root-only
file handed open, never on a command line), and the prolog asks Slurm nothing (`scontrol`)."""
import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, loosefs_bin, missing_prerequisite, need_mount

DEPLOY = ROOT / "deploy" / "slurm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


@contextlib.contextmanager
def cluster(site_conf: str = ""):
    """munged, slurmctld and slurmd of a one-node cluster, torn down after. `site_conf`: the
    prolog's site settings (its `/etc/loosefs/slurm.conf`, here `$LOOSEFS_SLURM_CONF` in the
    hooks' environment). The hooks' `scontrol` records each call in `scontrol.calls`."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"{tool} is not installed (scripts/setup.sh installs slurm-wlm)")
    d = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-slurm-", dir="/tmp"))
    d.chmod(0o755)
    procs = []
    try:
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge.sock"
        subprocess.run(["munged", "--force", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munged.seed"], check=True, timeout=30)
        host = socket.gethostname()
        bin_dir = pathlib.Path(loosefs_bin()).parent
        spy = d / "spy"
        spy.mkdir()
        (spy / "scontrol").write_text(f"#!/bin/sh\necho \"$*\" >> {d}/scontrol.calls\nexec {shutil.which('scontrol')} \"$@\"\n")
        (spy / "scontrol").chmod(0o755)
        conf = d / "loosefs-slurm.conf"
        conf.write_text(site_conf)
        conf.chmod(0o644)
        env_line = (f"export PATH={spy}:{bin_dir}:$PATH SLURM_CONF={d}/slurm.conf "
                    f"LOOSEFS_SLURM_CONF={conf}\n")
        for hook in ("prolog", "epilog"):
            w = d / f"{hook}.sh"
            w.write_text(f"#!/bin/bash\n{env_line}exec {DEPLOY / (hook + '.sh')}\n")
            w.chmod(0o755)
        (d / "slurm.conf").write_text(f"""ClusterName=loosefs
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmdSpoolDir={d}/slurmd
StateSaveLocation={d}/state
SlurmUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
Prolog={d}/prolog.sh
Epilog={d}/epilog.sh
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (d / "slurmd").mkdir()
        (d / "state").mkdir()
        env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
        procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(d / "slurm.conf"), "-L", str(d / "ctld.log")],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(d / "slurm.conf"), "-L", str(d / "slurmd.log")],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

        def idle():
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=30)
            return r.returncode == 0 and r.stdout.strip() == "idle"
        wait_for("the node to come up idle", idle)
        yield d, env
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["munged", f"--socket={d}/munge.sock", "--stop"], timeout=30, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def sbatch(env, work, comment, script) -> str:
    """Submits `script` (Python) as user 65534 with `--comment=loosefs:COMMENT`; its job id."""
    job = work / f"job{len(list(work.glob('job*.py')))}.py"
    job.write_text(script)
    job.chmod(0o644)
    r = subprocess.run(["sbatch", "--parsable", "--uid=65534", "--gid=65534", f"--comment=loosefs:{comment}",
                        f"--output={work}/slurm-%j.out", "--chdir=/tmp", f"--wrap=python3 {job}"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def wait_done(env, jid):
    def done():
        q = subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True, text=True, timeout=30)
        return q.stdout.strip() == ""
    wait_for(f"job {jid} to end", done, timeout=300)


def mounted(mnt: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == mnt for line in f)


def daemon_of(mnt: str) -> int:
    """The pid of the daemon serving the job's mount: the `loosefs mount … /dev/fd/3` whose log
    is the job's (its mountpoint is the handed descriptor, so the log path names the job) and
    whose parent runs the same command (the keeper, the process fuse-fd waits for)."""
    jid = mnt.rsplit("/", 1)[1]
    found = {}
    for d in pathlib.Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv[0].endswith(b"loosefs") and argv[1:2] == [b"mount"] and b"/dev/fd/3" in argv \
                and f"/var/log/loosefs/{jid}/daemon/daemon.log".encode() in argv:
            found[int(d.name)] = ppid
    daemons = [pid for pid, parent in found.items() if parent in found]
    assert len(daemons) == 1, f"daemons of {mnt}: {found}"
    return daemons[0]


def test_a_job_reads_its_dataset_as_its_own_user_and_no_one_else_can(pack, source):
    need_mount()
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    with cluster() as (d, env):
        shared = d / "data.pack"
        shutil.copyfile(pack, shared)
        shared.chmod(0o644)
        work = d / "work"
        work.mkdir()
        os.chown(work, 65534, 65534)
        out, again, out2, release = work / "job.out", work / "again", work / "job2.out", work / "release"
        # The job reads every file, says so; once told, reads every file again with O_DIRECT
        # (each read a request to the daemon, none from the page cache); then stays until the
        # test has looked at its mount.
        jid = sbatch(env, work, shared, (
            "import hashlib, json, mmap, os, pathlib, time\n"
            "r = pathlib.Path('/mnt/loosefs') / os.environ['SLURM_JOB_ID']\n"
            "buf = mmap.mmap(-1, 8 << 20)\n"
            "def direct(p):\n"
            "    fd, data = os.open(p, os.O_RDONLY | os.O_DIRECT), b''\n"
            "    while n := os.readv(fd, [buf]):\n"
            "        data += buf[:n]\n"
            "    os.close(fd)\n"
            "    return data\n"
            "def digests(read):\n"
            "    return json.dumps({str(p.relative_to(r)): hashlib.sha256(read(p)).hexdigest()"
            " for p in sorted(r.rglob('*')) if p.is_file() and '.loosefs' not in p.parts})\n"
            "def wait(f):\n"
            "    deadline = time.monotonic() + 240\n"
            "    while not pathlib.Path(f).exists() and time.monotonic() < deadline:\n"
            "        time.sleep(0.1)\n"
            f"pathlib.Path({str(out)!r}).write_text(digests(lambda p: p.read_bytes()))\n"
            f"wait({str(again)!r})\n"
            f"pathlib.Path({str(out2)!r}).write_text(digests(direct))\n"
            f"wait({str(release)!r})\n"))
        mnt = f"/mnt/loosefs/{jid}"
        try:
            wait_for("the job to read its dataset", out.exists, timeout=240)
            got = json.loads(out.read_text())
            log = (work / f"slurm-{jid}.out").read_text() if (work / f"slurm-{jid}.out").exists() else ""
            assert got == want, (log, (d / "slurmd.log").read_text()[-2000:])
            # The daemon runs as the job's user, with no capability.
            status = pathlib.Path(f"/proc/{daemon_of(mnt)}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines())
            assert fields["Uid"].split()[:2] == ["65534", "65534"], fields["Uid"]
            assert int(fields["CapEff"].strip(), 16) == 0, fields["CapEff"]
            # Another user of the node (uid 1, daemon) is refused the job's mount.
            other = subprocess.run(["setpriv", "--reuid=1", "--regid=1", "--clear-groups", "ls", mnt],
                                   capture_output=True, text=True, timeout=30)
            assert other.returncode != 0 and "Permission denied" in other.stderr, other
            # The daemon killed (the OOM killer, a crash) mid-job: its keeper starts another
            # on the same mount, and the job's second pass reads every file identical.
            killed = daemon_of(mnt)
            os.kill(killed, 9)
            again.write_text("")
            wait_for("the job's second pass", out2.exists, timeout=240)
            assert json.loads(out2.read_text()) == want, (d / "slurmd.log").read_text()[-2000:]
            assert daemon_of(mnt) != killed
        finally:
            again.write_text("")
            release.write_text("")
        wait_done(env, jid)
        wait_for("the epilog to unmount", lambda: not mounted(mnt))
        assert not pathlib.Path(mnt).exists()


def test_a_dataset_the_jobs_user_cannot_read_is_not_mounted_saying_why(pack):
    need_mount()
    with cluster() as (d, env):
        secret = d / "secret.pack"
        shutil.copyfile(pack, secret)
        secret.chmod(0o600)  # root's alone
        work = d / "work"
        work.mkdir()
        os.chown(work, 65534, 65534)
        out = work / "job.out"
        jid = sbatch(env, work, secret, (
            "import os, pathlib\n"
            "r = pathlib.Path('/mnt/loosefs') / os.environ['SLURM_JOB_ID']\n"
            f"pathlib.Path({str(out)!r}).write_text(repr(sorted(os.listdir(r)) if r.exists() else None))\n"))
        wait_done(env, jid)
        assert out.read_text() == "None", out.read_text()
        said = pathlib.Path(f"/var/log/loosefs/{jid}/prolog.log").read_text()
        assert f"{secret}: not readable by nobody: not mounted" in said, said
        assert not mounted(f"/mnt/loosefs/{jid}")


def test_train_sbatch_mounts_for_the_whole_job_and_unmounts_after(pack, source):
    # deploy/slurm/train.sbatch as written (one node here), as root, its command reading every
    # file in a step after the one that checked the mount: the daemon outlives steps.
    need_mount()
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    with cluster() as (d, env):
        data = d / "data.pack"
        shutil.copyfile(pack, data)
        out = d / "train.out"
        reader = d / "read.py"
        reader.write_text(
            "import hashlib, json, os, pathlib\n"
            "r = pathlib.Path(os.environ['LOOSEFS_MNT'])\n"
            f"pathlib.Path({str(out)!r}).write_text(json.dumps({{str(p.relative_to(r)):"
            " hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(r.rglob('*'))"
            " if p.is_file() and '.loosefs' not in p.parts}))\n")
        bin_dir = pathlib.Path(loosefs_bin()).parent
        r = subprocess.run(["sbatch", "--parsable", "--nodes=1", f"--output={d}/train-%j.out", "--chdir=/tmp",
                            f"--export=ALL,PATH={bin_dir}:{os.environ['PATH']}",
                            str(DEPLOY / "train.sbatch"), str(data), "python3", str(reader)],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        jid = r.stdout.strip().split(";")[0]
        wait_done(env, jid)
        log = (d / f"train-{jid}.out").read_text() if (d / f"train-{jid}.out").exists() else ""
        got = json.loads(out.read_text()) if out.exists() else {}
        assert got == want, log[-3000:]
        wait_for("the job's daemon to unmount", lambda: not mounted(f"/tmp/loosefs-{jid}"))


@contextlib.contextmanager
def prolog_run(comment: str):
    """Runs deploy/slurm/prolog.sh as slurmd would (root, the job's variables, `scontrol`
    answering the job's comment) for a job of user 65534 with a fresh job id; yields
    (run, logs) where run() runs the prolog to its end; removes the job's logs and mountpoint
    after."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-prolog-", dir="/tmp"))
    jid = str(900000 + os.getpid() % 90000)
    logs = pathlib.Path("/var/log/loosefs") / jid
    fake = d / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/sh\necho 'JobId={jid} Comment=loosefs:{comment} Other=x'\n")
    (fake / "scontrol").chmod(0o755)
    bin_dir = pathlib.Path(loosefs_bin()).parent
    env = dict(os.environ, PATH=f"{fake}:{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID=jid,
               SLURM_JOB_USER="nobody", SLURM_JOB_UID="65534", SLURM_JOB_GID="65534")

    def run():
        return subprocess.run([str(DEPLOY / "prolog.sh")], env=env, capture_output=True, text=True, timeout=300)
    try:
        yield run, logs
    finally:
        subprocess.run(["umount", "-l", f"/mnt/loosefs/{jid}"], capture_output=True, timeout=60)
        with contextlib.suppress(OSError):
            os.rmdir(f"/mnt/loosefs/{jid}")
        for p in pathlib.Path("/var/log/loosefs").glob(f"{jid}*"):
            shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)


# A process of the job's user that plants links as fast as it can, where root's logs go
# (`fuse-fd.log`, `prolog.log`) and where the daemon's goes: until killed.
PLANTER = """
import os, sys
logs, victim, secret = sys.argv[1:4]
targets = [(victim, os.path.join(logs, n)) for n in ("fuse-fd.log", "prolog.log")]
targets.append((secret, os.path.join(logs, "daemon", "daemon.log")))
while True:
    for src, at in targets:
        try:
            os.symlink(src, at)
        except OSError:
            pass
"""


@pytest.mark.parametrize("kind", ["unreadable", "not-a-dataset"])
def test_the_prolog_never_writes_or_reads_through_a_link_the_jobs_user_plants(kind, pack):
    # The attack of reliability-probe.md (slurm-log-dir-symlink): the job's user, already on
    # the node, plants links in the job's log directory, before the prolog (a directory left
    # with the job's id, holding links) and while it runs. Root must neither append to the
    # links' root-owned target nor copy a root-only secret into the user-readable prolog.log;
    # and the reason a daemon did not start is said (it was always empty).
    need_mount()
    if shutil.which("setpriv") is None:
        missing_prerequisite("setpriv is not installed (util-linux)")
    d = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-victim-", dir="/tmp"))
    d.chmod(0o755)
    victim, secret = d / "victim", d / "secret"
    victim.write_text("root's file\n")
    victim.chmod(0o644)
    secret.write_text("SECRET-ROOT-ONLY\n")
    secret.chmod(0o600)
    if kind == "unreadable":
        source = d / "root-only.pack"
        shutil.copyfile(pack, source)
        source.chmod(0o600)
    else:
        source = d / "junk.bin"
        source.write_bytes(b"not a dataset\n" * 100)
        source.chmod(0o644)
    try:
        with prolog_run(str(source)) as (run, logs):
            # Left by "an earlier job" with this id: a directory of the user's, links in it.
            logs.mkdir(parents=True)
            for name in ("fuse-fd.log", "prolog.log"):
                (logs / name).symlink_to(victim)
            os.chown(logs, 65534, 65534)
            planter = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                        sys.executable, "-c", PLANTER, str(logs), str(victim), str(secret)])
            try:
                r = run()
            finally:
                planter.kill()
                planter.wait(timeout=30)
            assert r.returncode == 0, r.stderr
            assert victim.read_text() == "root's file\n", "root appended through a planted link"
            st = logs.lstat()
            assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o755 and not logs.is_symlink()
            for name in ("fuse-fd.log", "prolog.log"):
                p = logs / name
                assert not p.is_symlink() and p.lstat().st_uid == 0, name
            said = (logs / "prolog.log").read_text()
            assert "SECRET" not in said and "SECRET" not in r.stderr, said
            if kind == "unreadable":
                assert f"{source}: not readable by nobody: not mounted" in said, said
            else:
                assert "the daemon did not start:" in said, said
                reason = said.split("the daemon did not start:", 1)[1].strip()
                assert str(source) in reason or "not a" in reason, said
            assert not mounted(f"/mnt/loosefs/{logs.name}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_remote_datasets_cache_is_on_the_nodes_disk_and_the_sites_credentials_reach_its_daemon_alone(pack, source, tmp_path):
    """A job names an S3 dataset; the site's settings put the block caches under a node-local
    root and give the daemon the bucket's keys from a root-only file (`env_file`). The job reads
    every file identical; the cache is the user's own 0700 directory there, holding the blocks;
    the keys are in the daemon's environment and nowhere another user can read (the file, the
    daemon's environment, the cache), nor in any command line or log; no `scontrol` call."""
    import servers
    need_mount()
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    moto = servers.Moto(tmp_path / "moto", bucket="slurmdata").start()
    try:
        moto.client().upload_file(str(pack), "slurmdata", "data.pack")
        site = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-site-", dir="/tmp"))
        site.chmod(0o755)
        cache_root = site / "scratch"  # the node's local disk, made by the prolog
        creds = site / "nobody.env"
        creds.write_text(f"# the site's keys for user nobody\nAWS_ACCESS_KEY_ID={servers.ACCESS_KEY}\n"
                         f"AWS_SECRET_ACCESS_KEY={servers.SECRET_KEY}\nAWS_ENDPOINT_URL_S3={moto.endpoint}\n"
                         "AWS_REGION=us-east-1\nAWS_EC2_METADATA_DISABLED=true\nLOOSEFS_ALLOW_HTTP=true\n")
        creds.chmod(0o600)
        conf = f"cache_root={cache_root}\ncache_size=2G\nenv_file={site}/%u.env\n"
        with cluster(conf) as (d, env):
            work = d / "work"
            work.mkdir()
            os.chown(work, 65534, 65534)
            out, release = work / "job.out", work / "release"
            jid = sbatch(env, work, "s3://slurmdata/data.pack", (
                "import hashlib, json, os, pathlib, time\n"
                "r = pathlib.Path('/mnt/loosefs') / os.environ['SLURM_JOB_ID']\n"
                f"pathlib.Path({str(out)!r}).write_text(json.dumps({{str(p.relative_to(r)):"
                " hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(r.rglob('*'))"
                " if p.is_file() and '.loosefs' not in p.parts}))\n"
                "deadline = time.monotonic() + 240\n"
                f"while not pathlib.Path({str(release)!r}).exists() and time.monotonic() < deadline:\n"
                "    time.sleep(0.1)\n"))
            mnt = f"/mnt/loosefs/{jid}"
            try:
                wait_for("the job to read its dataset", out.exists, timeout=240)
                logs = pathlib.Path(f"/var/log/loosefs/{jid}")
                assert json.loads(out.read_text()) == want, (logs / "prolog.log").read_text()
                cache = cache_root / "65534"
                st = cache.stat()
                assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o700), st
                assert sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) > 0, "no block cached"
                pid = daemon_of(mnt)
                argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                assert f"--cache-dir\0{cache}\0".encode() in argv and b"--env-file\0/dev/fd/4" in argv, argv
                environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                assert f"AWS_SECRET_ACCESS_KEY={servers.SECRET_KEY}".encode() in environ
                # Another user of the node (uid 1) reads none of it.
                for what in (["cat", str(creds)], ["cat", f"/proc/{pid}/environ"], ["ls", str(cache)]):
                    r = subprocess.run(["setpriv", "--reuid=1", "--regid=1", "--clear-groups", *what],
                                       capture_output=True, text=True, timeout=30)
                    assert r.returncode != 0 and servers.SECRET_KEY not in r.stdout, (what, r)
                # No command line on the node, no log holds the secret.
                for p in pathlib.Path("/proc").iterdir():
                    try:
                        assert servers.SECRET_KEY.encode() not in (p / "cmdline").read_bytes(), p
                    except OSError:
                        pass
                said = "".join(f.read_text(errors="replace") for f in logs.rglob("*.log"))
                assert servers.SECRET_KEY not in said
            finally:
                release.write_text("")
            wait_done(env, jid)
            wait_for("the epilog to unmount", lambda: not mounted(mnt))
            calls = (d / "scontrol.calls").read_text() if (d / "scontrol.calls").exists() else ""
            assert calls == "", f"the prolog or epilog called scontrol: {calls}"
        shutil.rmtree(site, ignore_errors=True)
    finally:
        moto.stop()
