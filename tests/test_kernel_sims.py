"""The NumPy simulations of the attention kernels' index arithmetic (tests/bench/*_sim.py) still
agree with plain attention: each mirrors a kernel lane by lane (tensor-core fragments, splits,
grouped rows) and asserts its own tolerance. They run here, without a GPU, so that they cannot rot
while those kernels change."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("sim", ["attention_mma_sim.py", "flash_prefill_sim.py", "flash_mma_sim.py", "attention_groups_sim.py"])
def test_kernel_simulation_agrees_with_plain_attention(sim):
    r = subprocess.run([sys.executable, str(REPO / "tests" / "bench" / sim)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
