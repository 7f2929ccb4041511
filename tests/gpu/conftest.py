"""The GPU suite runs when the driver reports a CUDA device, and is skipped otherwise.

It is skipped by device count (asked of libcuda), not by whether CuPy imports: on a
machine with a GPU, a broken CuPy fails these tests instead of hiding them.
"""
import pytest

from cotsdl import backend


def pytest_collection_modifyitems(config, items):
    if backend.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device (libcuda reports 0 or is absent)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
