"""tests/test_gpu.py's bookkeeping, checked here where no GPU is needed: every GPU test that builds
a binary lists its builds in TEST_BUILDS, so that `make test-gpu` makes them side by side before
the first test instead of one after another inside the tests."""

from __future__ import annotations

import inspect

import test_gpu


def test_every_building_gpu_test_lists_its_builds():
    tests = {name: f for name, f in vars(test_gpu).items() if name.startswith("test_") and inspect.isfunction(f)}
    building = {name for name, f in tests.items()
                if any(call in inspect.getsource(f) for call in ("flags_build(", "binary_for(", "tiny_gpu"))}
    assert sorted(building - set(test_gpu.TEST_BUILDS)) == []
    assert sorted(set(test_gpu.TEST_BUILDS) - set(tests)) == []
