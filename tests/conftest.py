"""Test-wide settings: offline hubs, headless rendering, and a schedule for parallel runs."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: a worker's torch (and the processes its tests
    # start) keeps to one thread, so workers do not fight over the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The slow learning tests take minutes each. `make test` hands out one test at a time
    # (--maxschedchunk 1), so putting them first spreads them over the workers, and the short tests
    # fill the rest of the time instead of one long test ending the run alone.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
