"""The order announced for unchanged PyTorch code (`LOOSEFS_ANNOUNCE_ORDER=1`, read by the
`.pth` file the package installs): a training script that knows nothing of loosefs iterates a
DataLoader over an ImageFolder on a real mount of the sample pack; with the hook on, the
mount's order stats show each epoch announced and served along its order, and the script's
sample sequence and its random-number state after the epochs are the same as with the hook
off. Covered: RandomSampler (shuffle=True) with and without workers, persistent workers over
two epochs, SequentialSampler, a BatchSampler over a RandomSampler, DistributedSampler for
two ranks. A sampler the hook does not know is left alone and said once."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, missing_prerequisite, order_stats

try:
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError as e:  # the venv of scripts/python-env.sh has both
    missing_prerequisite(f"torch/torchvision cannot be imported ({e})")

PTH = ROOT / "python" / "loosefs_announce_order.pth"

# A training script that knows nothing of loosefs: it prints the indices each epoch gave and
# three numbers drawn from the global generator afterwards.
SCRIPT = r'''
import json, sys
import torch, torchvision
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler

root, mode, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(7)


class RawFolder(torchvision.datasets.ImageFolder):
    def __getitem__(self, i):
        with open(self.samples[i][0], "rb") as f:
            return i, len(f.read()), float(torch.rand(1))  # a transform's random draw


class EveryOther(Sampler):
    def __init__(self, n):
        self.n = n
    def __iter__(self):
        return iter(range(0, self.n, 2))
    def __len__(self):
        return (self.n + 1) // 2


ds = RawFolder(root)
collate = lambda b: b
kw = dict(num_workers=workers, collate_fn=collate, persistent_workers=workers > 0 and epochs > 1)
if mode == "shuffle":
    loader = DataLoader(ds, batch_size=16, shuffle=True, **kw)
elif mode == "sequential":
    loader = DataLoader(ds, batch_size=16, **kw)
elif mode == "batch":
    loader = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 8, drop_last=True), **kw)
elif mode.startswith("rank"):
    sampler = DistributedSampler(ds, num_replicas=2, rank=int(mode[4:]), shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, **kw)
elif mode == "custom":
    loader = DataLoader(ds, batch_size=16, sampler=EveryOther(len(ds)), **kw)
seq = []
for e in range(epochs):
    if mode.startswith("rank"):
        sampler.set_epoch(e)
    seq.append([[i, n, r] for batch in loader for (i, n, r) in batch])
print(json.dumps({"epochs": seq, "after": torch.rand(3).tolist()}))
'''


def train(tmp_path, mnt, mode, workers, epochs, hook):
    """Runs SCRIPT as a user would, the package's .pth processed as at start-up (python/, which
    holds it, added as a site directory, as site-packages is), `LOOSEFS_ANNOUNCE_ORDER` =
    `hook`. Returns the script's output and its stderr."""
    site_dir = PTH.parent
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "LOOSEFS_ANNOUNCE_ORDER": hook}
    boot = ("import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", boot, str(site_dir), str(script), str(mnt), mode, str(workers),
                        str(epochs)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize("mode,workers,epochs", [
    ("shuffle", 2, 1),
    ("shuffle", 0, 1),
    ("shuffle", 2, 2),  # persistent workers: the second epoch comes through `_reset`
    ("sequential", 1, 1),
    ("batch", 2, 1),
])
def test_the_hook_announces_each_epoch_and_training_sees_the_same_samples(order_mount, tmp_path, mode, workers, epochs):
    on, err = train(tmp_path, order_mount, mode, workers, epochs, "1")
    o = order_stats(order_mount)
    n = len(on["epochs"][0])
    assert n > 0
    assert o["announced"] == epochs and o["unresolved_paths"] == 0, (o, err)
    assert o["abandoned"] == 0 and o["left"] == 0, o
    # The first epoch's files were all cold: each was served by the daemon, in the order.
    assert o["served"] + o["cached"] >= n * epochs and o["served"] >= n, o
    assert "not announced" not in err, err
    off, err = train(tmp_path, order_mount, mode, workers, epochs, "0")
    assert order_stats(order_mount)["announced"] == epochs, "LOOSEFS_ANNOUNCE_ORDER=0 announced"
    assert on == off, "the hook changed the samples or the random numbers drawn"


def test_two_ranks_announce_their_own_shares_and_see_the_same_samples(order_mount, tmp_path):
    served = 0
    for rank in (0, 1):
        on, err = train(tmp_path, order_mount, f"rank{rank}", 1, 1, "1")
        o = order_stats(order_mount)
        mine = len(on["epochs"][0])
        assert o["announced"] == rank + 1 and o["unresolved_paths"] == 0, (o, err)
        # Each rank's order is its own share: what it read ahead and served, no more.
        assert o["served"] - served == mine and o["left"] == 0, o
        served = o["served"]
        off, _ = train(tmp_path, order_mount, f"rank{rank}", 1, 1, "0")
        assert on == off, f"rank {rank}: the hook changed the samples"


def test_an_unknown_sampler_is_left_alone_and_said_once(order_mount, tmp_path):
    on, err = train(tmp_path, order_mount, "custom", 2, 2, "1")
    assert order_stats(order_mount)["announced"] == 0
    assert err.count("EveryOther is not a RandomSampler") == 1, err
    off, _ = train(tmp_path, order_mount, "custom", 2, 2, "0")
    assert on == off


def test_a_misspelt_switch_is_said_and_turns_nothing_on(order_mount, tmp_path):
    on, err = train(tmp_path, order_mount, "shuffle", 0, 1, "enabled")
    assert "LOOSEFS_ANNOUNCE_ORDER='enabled' is not one of" in err, err
    assert order_stats(order_mount)["announced"] == 0


def test_one_import_turns_it_on_without_the_environment(order_mount, tmp_path):
    script = tmp_path / "explicit.py"
    script.write_text("import loosefs.autoorder\n" + SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "LOOSEFS_ANNOUNCE_ORDER"}
    env["PYTHONPATH"] = str(ROOT / "python")
    r = subprocess.run([sys.executable, str(script), str(order_mount), "shuffle", "2", "1"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    o = order_stats(order_mount)
    assert o["announced"] == 1 and o["left"] == 0 and o["unresolved_paths"] == 0, o


def test_without_torch_the_hook_imports_nothing(tmp_path):
    """An interpreter that never imports torch pays nothing: the .pth imports only the small
    start-up module, which neither imports torch nor loosefs.autoorder."""
    site_dir = PTH.parent
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "LOOSEFS_ANNOUNCE_ORDER": "1"}
    check = ("import site, sys; site.addsitedir(sys.argv[1]); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'loosefs')))")
    r = subprocess.run([sys.executable, "-c", check, str(site_dir)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['loosefs', 'loosefs._options', 'loosefs._orderhook']", r.stdout
