"""The test suite's share of the cores for each pytest-xdist worker's torch threads (tests/conftest.py)."""

import pytest

from tests.conftest import threads_per_worker


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(2, 3, 1), (2, 2, 1), (16, 3, 5), (4, 1, 4), (4, 0, 4), (1, 8, 1)],
)
def test_each_worker_gets_its_share_of_the_cores_and_at_least_one(cores, workers, threads):
    assert threads_per_worker(cores, workers) == threads
