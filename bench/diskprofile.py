"""Disk profiles: the kernel's block throttling applied to a group of processes, so a reader and a
loosefs daemon started inside the group see a disk like a cloud volume or a hard disk, and the
group's own counters tell how many bytes they read from it.

Profiles (read limits on the disk that holds the data):
  host   no limit: whatever the machine's disk does (on a VM, possibly the host's cache)
  ssd    500 MB/s: a SATA SSD, and this VM's disk at its real speed (dd ~0.5 GB/s) whichever
         mood the host's cache is in
  cloud  125 MiB/s, 3,000 IOPS: a general-purpose cloud SSD volume at its baseline
  hdd    150 MB/s, 200 IOPS: a 7,200 rpm hard disk

cgroup v1 `blkio.throttle.read_bps_device` / `read_iops_device` where the blkio controller is
mounted, else cgroup v2 `io.max`. Limits are set on the whole disk (`MAJ:MIN`) under the data's
filesystem; a partition is mapped to its disk. Needs root.
"""
import os
import pathlib

PROFILES = {
    "host": (None, None),
    "ssd": (500_000_000, None),
    "cloud": (125 * 1024 * 1024, 3000),
    "hdd": (150_000_000, 200),
}
V1 = pathlib.Path("/sys/fs/cgroup/blkio")
V2_CANDIDATES = [pathlib.Path("/sys/fs/cgroup"), pathlib.Path("/sys/fs/cgroup/unified")]


def disk_of(path):
    """`MAJ:MIN` of the whole disk holding `path` (a partition maps to its parent disk)."""
    dev = os.stat(path).st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    sysdev = pathlib.Path("/sys/dev/block") / majmin
    if not sysdev.exists():
        raise RuntimeError(f"{path} is on device {majmin}, which is not a block device (tmpfs, overlay?): cannot throttle it")
    if (sysdev / "partition").exists():
        majmin = (sysdev.resolve().parent / "dev").read_text().strip()
    return majmin


def _v2_root():
    for r in V2_CANDIDATES:
        ctl = r / "cgroup.controllers"
        if ctl.exists() and "io" in ctl.read_text().split():
            return r
    return None


class Group:
    """A cgroup named `loosefs-<profile>` with the profile's limits on the disk of `path`."""

    def __init__(self, profile, path):
        if profile not in PROFILES:
            raise ValueError(f"unknown disk profile {profile!r}: one of {', '.join(PROFILES)}")
        self.profile, self.dev = profile, disk_of(path)
        bps, iops = PROFILES[profile]
        if (V1 / "cgroup.procs").exists():
            self.v1, self.dir = True, V1 / f"loosefs-{profile}"
            self.dir.mkdir(exist_ok=True)
            # 0 removes a limit (host, or a previous run's profile of the same name).
            (self.dir / "blkio.throttle.read_bps_device").write_text(f"{self.dev} {bps or 0}")
            (self.dir / "blkio.throttle.read_iops_device").write_text(f"{self.dev} {iops or 0}")
        else:
            root = _v2_root()
            if root is None:
                raise RuntimeError("neither a cgroup v1 blkio hierarchy nor a cgroup v2 io controller is available")
            sub = root / "cgroup.subtree_control"
            if "io" not in sub.read_text().split():
                sub.write_text("+io")
            self.v1, self.dir = False, root / f"loosefs-{profile}"
            self.dir.mkdir(exist_ok=True)
            (self.dir / "io.max").write_text(f"{self.dev} rbps={bps or 'max'} riops={iops or 'max'}")

    def join(self, pid=None):
        """Moves process `pid` (default: this one) into the group; its children start there."""
        (self.dir / "cgroup.procs").write_text(str(pid or os.getpid()))

    def read_bytes(self):
        """Bytes read from the disk by the group's processes so far (the group's counter)."""
        if self.v1:
            for line in (self.dir / "blkio.throttle.io_service_bytes").read_text().splitlines():
                f = line.split()
                if len(f) == 3 and f[0] == self.dev and f[1] == "Read":
                    return int(f[2])
            return 0
        for line in (self.dir / "io.stat").read_text().splitlines():
            f = line.split()
            if f and f[0] == self.dev:
                return int(dict(kv.split("=") for kv in f[1:]).get("rbytes", 0))
        return 0

    def describe(self):
        bps, iops = PROFILES[self.profile]
        if bps is None:
            return f"{self.profile} (no throttle, disk {self.dev})"
        return f"{self.profile} ({bps / 2**20:.0f} MiB/s, {iops} IOPS on disk {self.dev})"
