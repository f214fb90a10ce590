"""The tools a user would mount instead of loosefs, over the same files: kernel squashfs (loop
mount of an uncompressed `mksquashfs -noI -noD -noF -noX` image), squashfuse_ll on the same
image, fuse-zip on a stored zip, ratarmount and archivemount on a tar. Each builds its image
once (timed: the pack-time comparison) and mounts read-only; a tool that is missing or fails is
skipped with a note. archivemount is quadratic in the number of members, so on larger trees it
mounts a tar of the first ARCHIVEMOUNT_MAX files in pack order (an in-order pass with --limit
up to that reads the very same files; shuffled passes draw from that subset)."""
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

ARCHIVEMOUNT_MAX = 5000
VENV_BIN = pathlib.Path(sys.executable).parent


def _run(*args, timeout=3600):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, timeout=timeout)


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def build_images(data, work, files, names):
    """Builds what the peers in `names` need. Returns ({image: path}, {tool: seconds}, notes)."""
    images, seconds, notes = {}, {}, []
    want = set(names)
    if want & {"ratarmount", "archivemount"}:
        tar = work / "data.tar"
        seconds["tar cf"] = _timed(lambda: _run("tar", "cf", tar, "-C", data, "."))
        images["tar"] = tar
    if "archivemount" in want and len(files) > ARCHIVEMOUNT_MAX:
        sub = work / "data-subset.tar"
        listing = work / "data-subset.list"
        listing.write_text("".join(os.path.relpath(f, data) + "\n" for f in files[:ARCHIVEMOUNT_MAX]))
        _run("tar", "cf", sub, "-C", data, "-T", listing)
        images["tar-subset"] = sub
    if want & {"squashfs", "squashfuse"}:
        if shutil.which("mksquashfs"):
            img = work / "data.sqfs"
            img.unlink(missing_ok=True)
            seconds["mksquashfs -noI -noD -noF -noX"] = _timed(
                lambda: _run("mksquashfs", data, img, "-noI", "-noD", "-noF", "-noX", "-no-progress", "-quiet", "-noappend"))
            images["sqfs"] = img
        else:
            notes.append("mksquashfs missing: squashfs peers skipped")
    if "fuse-zip" in want:
        z = work / "data.zip"

        def write_zip():
            with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
                for f in files:
                    zf.write(f, os.path.relpath(f, data))

        seconds["python zipfile (stored)"] = _timed(write_zip)
        images["zip"] = z
    return images, seconds, notes


class Peer:
    """A mounted peer tool, with the interface bench/run.py's Target has."""

    is_loosefs = False

    def __init__(self, name, mnt, mount_cmd, umount_cmd):
        self.name, self.path, self.mnt = name, mnt, mnt
        self.mount_cmd, self.umount_cmd = mount_cmd, umount_cmd
        self.mount_seconds = None

    def mount(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        _run(*self.mount_cmd)
        # Wait until the mount answers (some tools return before their daemon serves).
        for _ in range(600):
            if os.path.ismount(self.mnt) and os.listdir(self.mnt):
                break
            time.sleep(0.05)
        self.mount_seconds = time.perf_counter() - t

    def umount(self):
        _run(*self.umount_cmd)

    def stats(self):
        return None


def make_peers(names, images, work, n_files):
    """The peers of `names` that can run here, and notes on those that cannot."""
    peers, notes = [], []
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    for n in names:
        mnt = work / f"m-{n}"
        if n == "squashfs" and "sqfs" in images:
            peers.append(Peer(n, mnt, ["mount", "-t", "squashfs", "-o", "loop,ro", images["sqfs"], mnt], ["umount", mnt]))
        elif n == "squashfuse" and "sqfs" in images and shutil.which("squashfuse_ll"):
            peers.append(Peer("squashfuse_ll", mnt, ["squashfuse_ll", images["sqfs"], mnt], [fusermount, "-u", mnt]))
        elif n == "fuse-zip" and "zip" in images and shutil.which("fuse-zip"):
            peers.append(Peer(n, mnt, ["fuse-zip", "-r", images["zip"], mnt], [fusermount, "-u", mnt]))
        elif n == "ratarmount" and (VENV_BIN / "ratarmount").exists():
            peers.append(Peer(n, mnt, [VENV_BIN / "ratarmount", images["tar"], mnt], [fusermount, "-u", mnt]))
        elif n == "archivemount" and shutil.which("archivemount"):
            tar = images["tar"]
            if n_files > ARCHIVEMOUNT_MAX:
                tar = images["tar-subset"]
                notes.append(f"archivemount mounts a tar of the first {ARCHIVEMOUNT_MAX} of {n_files} files in pack order "
                             "(it is quadratic in members): its in-order passes read the same files as the others "
                             "when --limit <= that, its shuffled passes draw from the subset")
            peers.append(Peer(n, mnt, ["archivemount", "-o", "readonly", tar, mnt], [fusermount, "-u", mnt]))
        else:
            notes.append(f"{n} unavailable here (run bench/install-peers.sh): skipped")
    return peers, notes
