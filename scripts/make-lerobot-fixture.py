"""Writes a small LeRobot v3 dataset with lerobot's own writer (`LeRobotDataset.create`,
`add_frame`, `save_episode`, `finalize`), the shape of ../shared/data/lerobot/so100-av1: 4
episodes of 60 frames at 30 fps, two cameras (`observation.images.top`, `.wrist`, 96x128,
AV1 by libsvtav1 with a keyframe every 2 frames, lerobot's defaults), `observation.state` and
`action` (6 float32 each), one task per episode. Camera frames pan a window across real
photographs (the JPEGs under IMAGES), so the codec sees real texture and motion.

Run inside the Debian trixie root (lerobot 0.6.1 needs Python >= 3.12), by
scripts/make-test-data.py:

    /venv/bin/python make-lerobot-fixture.py IMAGES OUT
"""
import pathlib
import random
import sys

import numpy as np
from PIL import Image
from lerobot.configs.video import RGBEncoderConfig
from lerobot.datasets.lerobot_dataset import LeRobotDataset

H, W, EPISODES, FRAMES = 96, 128, 4, 60


def window(img, t, n):
    """Frame `t` of `n` of a pan across `img`: a W x H crop moving right and bobbing."""
    big = img.convert("RGB").resize((W * 2, H * 2))
    x = int(W * t / max(1, n - 1))
    y = int(H * (0.5 + 0.5 * np.sin(t / 7))) // 2
    return np.asarray(big.crop((x, y, x + W, y + H)), dtype=np.uint8)


def main():
    images, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    photos = sorted(images.rglob("*.JPEG"))
    rng = random.Random(11)
    camera = {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]}
    joints = {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]}
    ds = LeRobotDataset.create(
        repo_id="loosefs/test-corpus", fps=30, root=out, robot_type="so100",
        features={"observation.images.top": camera, "observation.images.wrist": camera,
                  "observation.state": joints, "action": joints},
        rgb_encoder=RGBEncoderConfig(vcodec="libsvtav1", g=2))
    for ep in range(EPISODES):
        a, b = Image.open(rng.choice(photos)), Image.open(rng.choice(photos))
        for t in range(FRAMES):
            s = np.sin(np.arange(6) + t / 10 + ep).astype(np.float32)
            ds.add_frame({"observation.images.top": window(a, t, FRAMES),
                          "observation.images.wrist": window(b, FRAMES - 1 - t, FRAMES),
                          "observation.state": s, "action": np.roll(s, 1), "task": f"pick object {ep % 2}"})
        ds.save_episode()
    ds.finalize()


if __name__ == "__main__":
    main()
