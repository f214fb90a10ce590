"""Crafted and damaged datasets of every foreign format through the CLI (every 40th variant of
`hostile.py`'s sweep; run `tests/e2e/hostile.py` for all of them): `info`, `mount` + reading every
file, and `pack` under a 4 GiB address-space limit each refuse naming the file or succeed, no
panic, no hang, no signal, no pack left behind by a refusal, and every command and daemon peaks
under 1 GiB of RSS."""


import json
import subprocess
import sys

from conftest import missing_prerequisite, need_mount
import hostile


def test_crafted_inputs_are_refused_or_served_by_info_mount_and_pack(tmp_path):
    need_mount()
    if not (hostile.FORMATS / "manifest.json").is_file():
        missing_prerequisite("../shared/data/formats is missing")
    # The sweep in a process of its own: the peak RSS of its children is theirs alone (this
    # worker's RUSAGE_CHILDREN holds every earlier test's subprocesses and servers).
    out = tmp_path / "sweep.json"
    r = subprocess.run([sys.executable, hostile.__file__, "--stride", "40", "--limit-gib", "4", "--work",
                        str(tmp_path), "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert out.is_file(), (r.returncode, r.stderr[-3000:])
    res = json.loads(out.read_text())
    assert not res["failures"], "\n".join(res["failures"])
    c = res["counts"]
    # Both kinds of outcome were reached: the sweep is not all refusals, nor all passes.
    assert c["refused"] > 0 and c["mounted"] > 0 and c["packed"] > 0, c
    assert res["peak_rss_bytes"] < 1 << 30, res["peak_rss_bytes"]
