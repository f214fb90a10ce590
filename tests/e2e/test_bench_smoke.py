"""The bench harness in --quick mode completes and writes outputs that parse (no speed asserted)."""
import csv
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import need_mount

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_quick_completes_and_outputs_parse(source, tmp_path):
    need_mount()
    out = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--data", str(source), "--quick", "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = list(out.iterdir())
    res = json.loads((run / "results.json").read_text())
    targets = {row["target"] for row in res["rows"]}
    assert {"orig", "loosefs", "loosefs-warm", "loosefs-pin"} <= targets
    # --quick reads 300 files per pass (or the whole tree when smaller), every pass all of them.
    want = min(300, res["meta"]["files"])
    assert all(row["files"] == want and row["files_per_s"] > 0 for row in res["rows"]), [
        (row["target"], row["files"]) for row in res["rows"]]
    assert res["meta"]["cold_method"].startswith("drop_caches")
    with open(run / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(res["rows"])
    md = (run / "results.md").read_text()
    assert "| state | reader | order |" in md and "×" in md
    assert (run / "files_per_s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_bench_quick_completes_and_outputs_parse(source, tmp_path):
    need_mount()
    out = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode.py"), "--data", str(source), "--quick", "--out", str(out),
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = list(out.iterdir())
    res = json.loads((run / "results.json").read_text())
    assert set(res["warm"]) == {"jpeg-orig", "jpeg-loosefs", "ppm-loosefs", "npy-loosefs"}
    assert all(t["median"] > 0 for t in res["warm"].values())
    assert res["cold"]["npy_mount_raw4"]["median"] > 0 and res["cold"]["turbojpeg_1_thread"]["median"] > 0
    assert res["meta"]["npy_daemon"]["decodes"] > 0
    md = (run / "results.md").read_text()
    assert "| target | loop | files/s | ratio |" in md and "×" in md
    assert (run / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("loader,workers", [("imagefolder", 2), ("dali", 0), ("bytes", 2)])
def test_loader_pass_reports_parse(mount, loader, workers):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "loader_pass.py"), "--root", str(mount), "--loader", loader,
         "--workers", str(workers), "--order", "shuffled", "--limit", "64"],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["files"] == 64 and res["files_per_s"] > 0
    assert 0 < res["first_batch_s"] <= res["seconds"] and res["cpu_s"] > 0 and res["max_rss_bytes"] > 0


def test_bench_loader_rows_run_on_a_disk_profile(source, tmp_path):
    """DataLoader rows on the `cloud` profile: the disk's bytes are counted for them too (their
    passes report files, the bytes served come from the tree's mean file size)."""
    need_mount()
    out = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--data", str(source), "--profiles", "cloud", "--readers", "tv2",
         "--states", "cold", "--orders", "inorder", "--targets", "orig,loosefs", "--peers", "", "--repeat", "1", "--limit", "64",
         "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = list(out.iterdir())
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert {row["target"] for row in rows} == {"orig", "loosefs"}
    for row in rows:
        assert row["profile"] == "cloud" and row["files"] == 64 and row["bytes_from_mean_size"], row
        assert row["disk_bytes"] > 0 and row["disk_ratio"] > 0, row


def test_request_cost_bench_counts_the_daemons_work_per_request(source, tmp_path):
    need_mount()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "request_cost.py"), "--data", str(source), "--iters", "300"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(scratch)})
    assert r.returncode == 0, r.stderr[-3000:]
    # Its pack and mountpoint went with it (each run left 106 MB behind before).
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in r.stdout.splitlines()[2:]]
    # Both transports where the kernel offers FUSE over io_uring, /dev/fuse alone elsewhere.
    want = {"classic", "uring"} if pathlib.Path("/sys/module/fuse/parameters/enable_uring").exists() else {"classic"}
    assert {x[2] for x in rows} == want and len(rows) == 18 * len(want), r.stdout
    for transport in want:
        ioctl = [x for x in rows if x[0].startswith("ioctl") and x[1] == "1" and x[2] == transport][0]
        # A request reached the daemon for every call: its CPU time per call is not zero.
        assert float(ioctl[6]) > 0 and float(ioctl[3]) > 0, ioctl


def test_bench_runs_the_automatic_order_target(source, tmp_path):
    """`loosefs-auto` (LOOSEFS_ANNOUNCE_ORDER=1 through the package's .pth) runs its DataLoader
    rows beside the same loader without it; raw readers skip it."""
    need_mount()
    out = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--data", str(source), "--readers", "bytes2,raw1",
         "--states", "cold", "--orders", "shuffled", "--targets", "loosefs,loosefs-auto", "--peers", "",
         "--repeat", "1", "--limit", "64", "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = list(out.iterdir())
    rows = json.loads((run / "results.json").read_text())["rows"]
    got = sorted((row["target"], row["reader"]) for row in rows)
    assert got == [("loosefs", "bytes2"), ("loosefs", "raw1"), ("loosefs-auto", "bytes2")], got
    assert all(row["files"] == 64 and row["files_per_s"] > 0 for row in rows), rows
