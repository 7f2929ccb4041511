"""The numpy backend's thread pool (ops/cpu/parallel): the caller works beside threads - 1 helpers."""
import threading
import time

import pytest

from cotsdl.ops.cpu import parallel


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    parallel.set_num_threads(request.param)
    yield request.param
    parallel.set_num_threads(None)


def test_results_in_order_and_every_range_once(threads):
    seen, lock = [], threading.Lock()

    def work(lo, hi):
        with lock:
            seen.append((lo, hi))
        return lo * 10 + hi
    bounds = [(k, k + 1) for k in range(11)]
    assert parallel.run_ranges(bounds, work) == [k * 10 + k + 1 for k in range(11)]
    assert sorted(seen) == bounds


def test_the_caller_and_at_most_threads_minus_one_helpers_run(threads):
    names, lock = set(), threading.Lock()

    def work(lo, hi):
        time.sleep(0.01)  # long enough that every helper takes a range
        with lock:
            names.add(threading.current_thread().name)
    parallel.run_split(8, work)
    assert threading.current_thread().name in names or threads == 1
    assert len(names) <= threads


@pytest.mark.parametrize("failing", [0, 5])
def test_an_error_in_any_range_is_raised_after_all_ranges_ended(threads, failing):
    ended = []

    def work(lo, hi):
        if lo == failing:
            raise ValueError(f"range {lo}")
        time.sleep(0.005)
        ended.append(lo)
    with pytest.raises(ValueError, match=f"range {failing}"):
        parallel.run_ranges([(k, k + 1) for k in range(6)], work)
    time.sleep(0.05)
    settled = list(ended)
    time.sleep(0.05)
    assert ended == settled  # nothing still running after the call returned


def test_run_split_covers_the_range_in_near_equal_shares(threads):
    got = []
    parallel.run_split(10, lambda lo, hi: got.append((lo, hi)))
    got.sort()
    assert got[0][0] == 0 and got[-1][1] == 10 and all(a[1] == b[0] for a, b in zip(got, got[1:]))
    sizes = [hi - lo for lo, hi in got]
    assert len(got) == min(10, threads) and max(sizes) - min(sizes) <= 1


def test_no_range_starts_after_an_error():
    parallel.set_num_threads(2)
    started = []
    try:
        def work(lo, hi):
            started.append(lo)
            if lo == 0:
                raise ValueError("first")
            time.sleep(0.02)
        with pytest.raises(ValueError, match="first"):
            parallel.run_ranges([(k, k + 1) for k in range(20)], work)
    finally:
        parallel.set_num_threads(None)
    assert len(started) <= 3  # the failing range, and what the helper had taken meanwhile
