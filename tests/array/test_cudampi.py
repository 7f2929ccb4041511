import pytest

from cotsdl.array.cudampi import ENV, cuda_aware_mpi


@pytest.mark.parametrize("value, expect", [("0", False), ("1", True), (" 1 ", True)])
def test_setting_wins(monkeypatch, value, expect):
    monkeypatch.setenv(ENV, value)
    assert cuda_aware_mpi() is expect


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=f"{ENV} must be 0 or 1, got 'yes'"):
        cuda_aware_mpi()


def test_query_of_the_loaded_library(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    # The MPICH wheel is built without CUDA: the query answers False (or None if
    # the library has no MPIX_Query_cuda_support); it never claims support.
    assert cuda_aware_mpi() in (False, None)
