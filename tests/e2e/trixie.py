"""A second Linux in a directory: scripts/trixie-root.sh makes a Debian trixie root (Python 3.13,
lerobot 0.6.1 in /venv; another glibc, no FFmpeg, no Rust, no C compiler), and `run` enters it
with chroot in a private mount namespace (`unshare --mount`), where host directories and mounts
are bind-mounted; the binds vanish with the namespace. LeRobot's own loader (Python >= 3.12)
runs there, and the release wheel is installed there."""
import json
import os
import pathlib
import subprocess

from conftest import ROOT, missing_prerequisite


# The verdict of the one attempt at making the root in this session: its path, or why not.
_ROOT: list = []


def root() -> pathlib.Path:
    """The trixie root (made on first use by scripts/trixie-root.sh, which needs root and
    Debian's archive); a missing one is a missing prerequisite (a failure under CI=true).
    Made at most once per session, and not at all when scripts/test.sh's own phase failed
    ($LOOSEFS_TRIXIE_FAILED): a failure costs one attempt, not one per test."""
    if os.geteuid() != 0:
        missing_prerequisite("the trixie root needs root (debootstrap, chroot)")
    if os.environ.get("LOOSEFS_TRIXIE_FAILED"):
        missing_prerequisite(f"scripts/test.sh could not make the trixie root: {os.environ['LOOSEFS_TRIXIE_FAILED']}")
    if not _ROOT:
        r = subprocess.run([str(ROOT / "scripts" / "trixie-root.sh")], capture_output=True, text=True, timeout=1800)
        _ROOT.append(pathlib.Path(r.stdout.strip()) if r.returncode == 0 else f"scripts/trixie-root.sh failed: {r.stderr[-2000:]}")
    if isinstance(_ROOT[0], str):
        missing_prerequisite(_ROOT[0])
    return _ROOT[0]


def run(code: str, binds: dict, timeout: float = 600, python: str = "/venv/bin/python", prelude: str = ""):
    """Runs `code` with `python` inside the root (lerobot's venv by default), after the shell
    commands `prelude` (also inside), each `binds` host path bind-mounted at its path inside
    the root (`/data/...`) by scripts/in-trixie.sh; returns what the code printed last, parsed
    as JSON. Nothing inside may reach beyond this machine: lerobot runs offline
    (HF_HUB_OFFLINE=1) and pip, in a prelude, installs from bound files with --no-index."""
    root()
    cmd = [str(ROOT / "scripts" / "in-trixie.sh")]
    for host, inner in binds.items():
        cmd += ["--bind", f"{host}:{inner}"]
    cmd += ["--", "sh", "-c", f"set -e\n{prelude}\nexec {python} -c \"$0\"", code]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return json.loads(r.stdout.strip().splitlines()[-1])
