"""The driver's image as a platform team gets it: `deploy/container/build.sh OUT.tar` builds it
from scratch with Debian's buildah (no base image pulled) around the binary under test, podman
loads the OCI archive into a storage of the test's own, and runs it with no network, `/dev/fuse`
and CAP_SYS_ADMIN: the daemon inside mounts a pack at a directory shared with the host, whose
every file reads identical to the source; a stop unmounts it. The image's user is nobody, its
root read-only, and it holds the binary, the libraries it loads and CA certificates only."""
import hashlib
import json
import pathlib
import resource
import shutil
import subprocess
import tempfile

from conftest import ROOT, loosefs_bin, missing_prerequisite, need_mount
from test_csi import wait_for

IMAGE = "localhost/loosefs:under-test"


def mounted(path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == str(path) for line in f)


def test_the_image_builds_from_scratch_and_mounts_a_pack_inside_podman(pack, source):
    need_mount()
    for tool in ("buildah", "podman", "runc", "objcopy", "readelf"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"{tool} is not installed (scripts/setup.sh installs it)")
    want = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(source.rglob("*")) if p.is_file()}
    base = pathlib.Path(tempfile.mkdtemp(prefix="loosefs-image-", dir="/tmp"))
    archive = base / "loosefs.tar"
    podman = ["podman", "--root", str(base / "storage"), "--runroot", str(base / "run"),
              "--storage-driver", "vfs", "--runtime", "runc"]
    # Limits no higher than this process's: podman would raise them (to 1048576 and 32768),
    # which a machine without CAP_SYS_RESOURCE refuses.
    limits = []
    for name, which, most in (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 4096)):
        soft, hard = resource.getrlimit(which)
        n = min(x for x in (soft, hard, most) if x != resource.RLIM_INFINITY)
        limits += ["--ulimit", f"{name}={n}:{n}"]
    shared = base / "shared"
    data = base / "data"
    try:
        r = subprocess.run([str(ROOT / "deploy" / "container" / "build.sh"), str(archive), IMAGE],
                           env={**__import__("os").environ, "LOOSEFS_BIN": loosefs_bin()},
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        print(f"image archive: {archive.stat().st_size / 1e6:.1f} MB")
        r = subprocess.run([*podman, "load", "-q", "-i", str(archive)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and IMAGE in r.stdout, (r.stdout, r.stderr)
        inspect = json.loads(subprocess.run([*podman, "image", "inspect", IMAGE], capture_output=True,
                                            text=True, timeout=60, check=True).stdout)[0]
        config = inspect["Config"]
        assert config["User"] == "65534:65534" and config["Entrypoint"] == ["/usr/local/bin/loosefs"], config
        assert len(inspect["RootFS"]["Layers"]) == 1, inspect["RootFS"]  # one layer, from scratch
        # What is inside: the binary (stripped), libraries, the loader, certificates; no shell.
        listing = subprocess.run(["tar", "-tf", str(archive)], capture_output=True, text=True, check=True).stdout
        assert "index.json" in listing
        root = ROOT / "target" / "container-root"
        assert not (root / "bin" / "sh").exists() and (root / "etc/ssl/certs/ca-certificates.crt").exists()
        # Stripped of its debug sections (the binary under test may have been stripped already:
        # the release wheel's build is).
        sections = subprocess.run(["readelf", "-S", "--wide", str(root / "usr/local/bin/loosefs")],
                                  capture_output=True, text=True, timeout=60, check=True).stdout
        assert ".text" in sections and ".debug_info" not in sections
        v = subprocess.run([*podman, "run", "--rm", "--network", "none", "--read-only", *limits, IMAGE,
                            "--version"], capture_output=True, text=True, timeout=120)
        assert v.returncode == 0 and v.stdout.startswith("loosefs "), (v.stdout, v.stderr)
        # A pack mounted inside, seen on the host through a shared bind.
        data.mkdir()
        shutil.copyfile(pack, data / "train.pack")
        (shared / "view").mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(shared), str(shared)], check=True, timeout=30)
        subprocess.run(["mount", "--make-shared", str(shared)], check=True, timeout=30)
        r = subprocess.run([*podman, "run", "-d", "--name", "loosefs-under-test", "--network", "none",
                            "--read-only", *limits, "--user", "0", "--cap-add", "SYS_ADMIN",
                            "--device", "/dev/fuse", "-v", f"{data}:/data:ro", "-v", f"{shared}:/mnt:rshared",
                            IMAGE, "mount", "/data/train.pack", "/mnt/view", "--foreground"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        view = shared / "view"
        logs = lambda: subprocess.run([*podman, "logs", "loosefs-under-test"], capture_output=True,  # noqa: E731
                                      text=True, timeout=60).stdout
        wait_for("the mount inside the container", lambda: mounted(view), timeout=120)
        got = {str(p.relative_to(view)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(view.rglob("*")) if p.is_file()}
        assert got == want, logs()
        subprocess.run([*podman, "stop", "-t", "30", "loosefs-under-test"], capture_output=True, timeout=120)
        assert not mounted(view), "a stopped container's mount is left"
    finally:
        subprocess.run([*podman, "rm", "-f", "loosefs-under-test"], capture_output=True, timeout=120)
        if mounted(shared / "view"):
            subprocess.run(["umount", "-l", str(shared / "view")], timeout=30)
        if mounted(shared):
            subprocess.run(["umount", "-l", str(shared)], timeout=30)
        shutil.rmtree(base, ignore_errors=True)
