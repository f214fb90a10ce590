"""The Slurm recipe in deploy/slurm/ on a one-node Slurm cluster started here (munged,
slurmctld and slurmd from Debian's slurm-wlm, on free ports, in a temporary directory): a job
that names its dataset (`--comment=loosefs:SOURCE`) finds it mounted by the root Prolog at
/mnt/loosefs/$SLURM_JOB_ID, reads it as an unprivileged user byte for byte, and the Epilog
leaves no mount behind."""
import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
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
def cluster():
    """munged, slurmctld and slurmd of a one-node cluster, torn down after."""
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
        env_line = f"export PATH={bin_dir}:$PATH SLURM_CONF={d}/slurm.conf\n"
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


def test_a_job_finds_its_dataset_mounted_by_the_prolog_and_the_epilog_unmounts_it(pack, source):
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
        out = work / "job.out"
        job = d / "job.py"
        job.write_text(
            "import hashlib, json, os, pathlib\n"
            "r = pathlib.Path('/mnt/loosefs') / os.environ['SLURM_JOB_ID']\n"
            f"pathlib.Path({str(out)!r}).write_text(json.dumps({{str(p.relative_to(r)):"
            " hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(r.rglob('*'))"
            " if p.is_file() and '.loosefs' not in p.parts}))\n")
        job.chmod(0o644)
        r = subprocess.run(["sbatch", "--parsable", "--uid=65534", "--gid=65534", f"--comment=loosefs:{shared}",
                            f"--output={work}/slurm-%j.out", "--chdir=/tmp",
                            f"--wrap=python3 {job}"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        jid = r.stdout.strip().split(";")[0]

        def done():
            q = subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True, text=True, timeout=30)
            return q.stdout.strip() == ""
        wait_for(f"job {jid} to end", done, timeout=300)
        mnt = f"/mnt/loosefs/{jid}"

        def unmounted():
            with open("/proc/self/mountinfo") as f:
                return not any(line.split(" ")[4] == mnt for line in f)
        wait_for("the epilog to unmount", unmounted)
        log = (work / f"slurm-{jid}.out").read_text() if (work / f"slurm-{jid}.out").exists() else ""
        got = json.loads(out.read_text()) if out.exists() else {}
        assert got == want, (log, (d / "slurmd.log").read_text()[-2000:])
        assert not pathlib.Path(mnt).exists()
