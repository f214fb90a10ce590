"""Fixtures for the end-to-end loader tests: a source ImageFolder tree, its pack, and a real
loosefs mount of it (root and /dev/fuse required: without them every test here is skipped, or fails under CI=true)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# No test may send a request beyond 127.0.0.1: the credential chain's last source, EC2 instance
# metadata (169.254.169.254), is off for every process a test starts, and every cloud's
# metadata endpoint (EC2, GCE, Azure's managed identity) is a closed local port besides, for a
# test that turns EC2's back on (test_ways_in.py) or reaches GCS or Azure.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
CLOSED_PORT = "127.0.0.1:9"  # discard: nothing listens there on a test machine
for _k, _v in {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{CLOSED_PORT}", "GCE_METADATA_HOST": CLOSED_PORT,
               "GCE_METADATA_IP": CLOSED_PORT,
               "AZURE_MSI_ENDPOINT": f"http://{CLOSED_PORT}/metadata/identity/oauth2/token"}.items():
    os.environ.setdefault(_k, _v)



def loosefs_bin() -> str:
    b = os.environ.get("LOOSEFS_BIN", str(ROOT / "target" / "release" / "loosefs"))
    if not os.path.exists(b):
        pytest.fail(f"loosefs binary {b} not built (run cargo build --release)")
    return b


def test_corpus() -> pathlib.Path:
    """The corpus scripts/make-test-data.py makes, laid out as ../shared/data is
    (`imagenet-sample/`: 1,000 JPEGs cut from real photographs; `formats/`: their first 48
    classes by each format's writer): `$LOOSEFS_TEST_DATA` (scripts/test.sh sets it), else
    made (or found cached) now."""
    env = os.environ.get("LOOSEFS_TEST_DATA")
    if not env:
        env = subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-data.py")], check=True,
                             stdout=subprocess.PIPE, text=True, timeout=900).stdout.strip()
        os.environ["LOOSEFS_TEST_DATA"] = env
    return pathlib.Path(env)


# The data the tests read: ../shared/data beside the checkout (CI's machines and the
# workspace), else the corpus the project makes itself (a user's clone; with LeRobot's dataset
# as root).
# LOOSEFS_TEST_CLONE_ALONE=1 hides ../shared as a user's clone lacks it (scripts/test.sh's
# clone-alone pass).
CLONE_ALONE = os.environ.get("LOOSEFS_TEST_CLONE_ALONE") == "1"
DATA = ROOT.parent / "shared" / "data"
if CLONE_ALONE or not DATA.is_dir():
    DATA = test_corpus()
SHARED = DATA / "imagenet-sample"


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> pathlib.Path:
    """What the tests read: `$LOOSEFS_DATA`, else the ImageNet sample of [`DATA`]."""
    env = os.environ.get("LOOSEFS_DATA")
    if env:
        return pathlib.Path(env)
    return SHARED


def missing_prerequisite(what: str):
    """A test's prerequisite is missing: under CI=true the test fails saying so, elsewhere it is
    skipped (shown by `pytest -rs`)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {what}: the test cannot run")
    pytest.skip(f"SKIPPED: {what}", allow_module_level=True)


def need_mount():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but mounting needs root and /dev/fuse: the loader tests cannot run")
        pytest.skip("SKIPPED: mounting needs root and /dev/fuse")


@pytest.fixture(scope="session")
def pack(source, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("pack") / "data.pack"
    subprocess.run([loosefs_bin(), "pack", str(source), str(out)], check=True)
    return out


@pytest.fixture(scope="session")
def decoded_mount(pack, tmp_path_factory):
    """The pack mounted with both decoded views: x.npy beside x.JPEG, and x.JPEG serving PPM."""
    need_mount()
    work = tmp_path_factory.mktemp("dec")
    mnt = work / "mnt"
    mnt.mkdir()
    b = loosefs_bin()
    subprocess.run([b, "mount", str(pack), str(mnt), "--decode", "npy,ppm", "--log", str(work / "daemon.log")], check=True)
    try:
        yield mnt
    finally:
        subprocess.run([b, "umount", str(mnt)], check=True)


@pytest.fixture(scope="session")
def mount(source, tmp_path_factory):
    need_mount()
    work = tmp_path_factory.mktemp("mnt")
    pack = work / "data.pack"
    mnt = work / "mnt"
    mnt.mkdir()
    b = loosefs_bin()
    subprocess.run([b, "pack", str(source), str(pack)], check=True)
    subprocess.run([b, "mount", str(pack), str(mnt), "--log", str(work / "daemon.log")], check=True)
    try:
        yield mnt
    finally:
        subprocess.run([b, "umount", str(mnt)], check=True)


@pytest.fixture
def order_mount(pack, tmp_path, monkeypatch):
    """A fresh mount of the sample pack per test, through the Python API (orders and their
    counters start at zero)."""
    need_mount()
    sys.path.insert(0, str(ROOT / "python"))
    import loosefs

    monkeypatch.setenv("LOOSEFS_BIN", loosefs_bin())
    (tmp_path / "mnt").mkdir()
    with loosefs.mount(pack, tmp_path / "mnt") as m:
        yield pathlib.Path(m.path)


def order_stats(mnt: pathlib.Path) -> dict:
    """The `order` section of the mount's stats: announced orders and how they were served."""
    import json

    with open(mnt / ".loosefs" / "stats") as f:
        return json.load(f)["order"]


@pytest.fixture(scope="session", params=["pack", "dir", "dir-passthrough"])
def loader_mount(request, source, tmp_path_factory):
    """What the loader tests read: the pack's mount, and the source directory mounted in place
    (read by the daemon, and with FUSE passthrough: the kernel reads the original files)."""
    if request.param == "pack":
        yield request.getfixturevalue("mount")
        return
    need_mount()
    work = tmp_path_factory.mktemp(request.param)
    mnt = work / "mnt"
    mnt.mkdir()
    b = loosefs_bin()
    extra = ["--passthrough", "on"] if request.param == "dir-passthrough" else []
    subprocess.run([b, "mount", str(source), str(mnt), "--log", str(work / "daemon.log"), *extra], check=True)
    try:
        yield mnt
    finally:
        subprocess.run([b, "umount", str(mnt)], check=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In the clone-alone pass (LOOSEFS_TEST_CLONE_ALONE=1) a skip is a failure: a clone must
    have every test's data (the corpus holds every format, FFCV included, and LeRobot's)."""
    outcome = yield
    rep = outcome.get_result()
    if CLONE_ALONE and rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"skipped in the clone-alone pass (no skip may happen from a clone): {rep.longrepr}"
