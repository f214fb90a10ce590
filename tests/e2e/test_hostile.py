"""Crafted and damaged datasets of every foreign format through the CLI (every 40th variant of
`hostile.py`'s sweep; run `tests/e2e/hostile.py` for all of them): `info`, `mount` + reading every
file, and `pack` under a 4 GiB address-space limit each refuse naming the file or succeed, no
panic, no hang, no signal, no pack left behind by a refusal, and every command and daemon peaks
under 1 GiB of RSS."""


from conftest import missing_prerequisite, need_mount
import hostile


def test_crafted_inputs_are_refused_or_served_by_info_mount_and_pack(tmp_path):
    need_mount()
    if not (hostile.FORMATS / "manifest.json").is_file():
        missing_prerequisite("../shared/data/formats is missing")
    s = hostile.Sweep(4 << 30, tmp_path)
    for rel, fmt in hostile.FIXTURES:
        s.fixture(rel, fmt, 40)
    assert not s.failures, "\n".join(s.failures)
    c = s.counts
    # Both kinds of outcome were reached: the sweep is not all refusals, nor all passes.
    assert c["refused"] > 0 and c["mounted"] > 0 and c["packed"] > 0, c
    assert s.peak() < 1 << 30, s.peak()
