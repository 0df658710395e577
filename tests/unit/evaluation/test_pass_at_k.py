import math

import numpy as np
import pytest

from evaluation.pass_at_k import estimate_pass_at_k, pass_at_k_table


def by_comb(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_hand_computed_values():
    # n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    assert estimate_pass_at_k(5, [2], 1)[0] == pytest.approx(0.4)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert estimate_pass_at_k(5, [2], 2)[0] == pytest.approx(0.7)
    # n=10, c=1, k=5: 1 - C(9,5)/C(10,5) = 1 - 126/252 = 0.5
    assert estimate_pass_at_k(10, [1], 5)[0] == pytest.approx(0.5)


def test_edge_cases():
    assert estimate_pass_at_k(10, [0], 5)[0] == 0.0  # c = 0
    assert estimate_pass_at_k(10, [10], 5)[0] == 1.0  # c = n
    assert estimate_pass_at_k(10, [7], 5)[0] == 1.0  # n - c < k: every 5-subset has a correct one
    with pytest.raises(ValueError, match="at least 5 samples"):
        estimate_pass_at_k(4, [1], 5)  # n < k
    with pytest.raises(ValueError):
        estimate_pass_at_k(4, [5], 1)  # c > n
    with pytest.raises(ValueError):
        estimate_pass_at_k(4, [1], 0)


def test_matches_math_comb_everywhere_small():
    for n in range(1, 16):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert estimate_pass_at_k(n, [c], k)[0] == pytest.approx(by_comb(n, c, k), abs=1e-12)


def test_large_n_is_stable():
    value = estimate_pass_at_k(200, [3], 100)[0]
    assert value == pytest.approx(by_comb(200, 3, 100), rel=1e-9) and 0 < value < 1


def test_per_task_arrays_and_table():
    per_task = estimate_pass_at_k([5, 10], [2, 0], 1)
    assert np.allclose(per_task, [0.4, 0.0])
    table = pass_at_k_table([5, 10], [2, 0], [1, 5, 10])
    assert table[1] == pytest.approx(0.2)
    assert table[5] == pytest.approx((by_comb(5, 2, 5) + 0.0) / 2)
    assert table[10] is None  # one task has only 5 samples: not computable, reported as such
    assert pass_at_k_table([], [], [1]) == {1: None}
