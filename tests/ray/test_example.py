"""examples/ray_train.py finishes on the two-node cluster: Ray Train fed by a fleet."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_ray_train_example_trains_two_workers_on_a_fleet(cluster: Cluster,
                                                         tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "ray_train.py"), "--address", cluster.address,
         "--epochs", "2", "--storage", str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert process.returncode == 0, output[-4000:]
    servers = re.search(r"fleet servers: \[(.*)\]", output)
    assert servers and "127.0.0.2" in servers.group(1) and "127.0.0.3" in servers.group(1)
    # 4 files x 64 samples, 2 epochs, 2 ranks: 256 samples and 32 steps of 8 each.
    assert re.search(r"ray_train: 2 workers, 32 steps each, 256 samples each", output), \
        output[-4000:]
