"""APPS's own verdict for a stdin test, restated from `eval/testing_util.py` (hendrycks/apps) for the parity
tests: what its harness accepts, with each check it runs in order, and its known bugs behind flags.

The harness captures stdout as `splitlines()` and accepts the first of these that holds:
1. the captured lines joined by "\\n" equal the expected text, both stripped at the ends (also with each
   captured line stripped);
2. the line lists are equal once the expected text is split on "\\n", its empty lines dropped and each
   line stripped (also with the captured empty lines dropped);
3. every line is one number and the numbers are close (numpy.allclose: |a - b| <= 1e-8 + 1e-5 * |b|);
4. (its token-set bug, `set_rule=True`) each line as the set of its tokens, and the output as the set of
   those sets, also with every token rounded to 3 decimals: the order of tokens and of lines, and
   repetition, are lost.

`statement_tolerance=True` replaces check 3's numpy tolerance with the one APPS statements state
("absolute or relative error at most 1e-6": |a - b| <= 1e-6 * max(1, |b|)), token by token within a line.

Its import block is restated in `APPS_IMPORTS` (prepended to every program, both modes).
"""

from __future__ import annotations

import math

APPS_IMPORTS = (
    "import sys\nimport time\nimport itertools\nfrom itertools import accumulate, product, permutations, combinations\n"
    "import collections\nfrom collections import Counter, OrderedDict, deque, defaultdict, ChainMap\n"
    "from functools import lru_cache\nimport math\nfrom math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, "
    "log, log2\nimport fractions\nfrom typing import List, Tuple\nimport numpy as np\nimport random\nimport heapq\n"
    "from heapq import *\n"
)


def _float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _close_statement(got: str, want: str) -> bool:
    """One token under the statements' rule: an integer exactly, a float within 1e-6 * max(1, |want|)."""
    if got == want:
        return True
    if want.lstrip("+-").isdigit():
        return got.lstrip("+-").isdigit() and int(got) == int(want)
    x, y = _float(got), _float(want)
    return x is not None and y is not None and abs(x - y) <= 1e-6 * max(1.0, abs(y)) * (1 + 1e-9)


def apps_accepts(stdout: str, expected: str, *, set_rule: bool = False, statement_tolerance: bool = False) -> bool:
    output = stdout.splitlines()
    # 1. stripped text, also with stripped lines
    if (
        "\n".join(output).strip() == expected.strip()
        or "\n".join(o.strip() for o in output).strip() == expected.strip()
    ):
        return True
    want = [line.strip() for line in expected.split("\n") if line]
    # 2. line lists
    if output == want or [o.strip() for o in output] == want:
        return True
    kept = [o for o in output if o]
    if kept == want:
        return True
    # 3. numbers, one per line
    if statement_tolerance:
        got_lines = [o.split() for o in kept if o.strip()]
        want_lines = [w.split() for w in want if w.strip()]
        if len(got_lines) == len(want_lines) and all(
            len(g) == len(w) and all(_close_statement(a, b) for a, b in zip(g, w, strict=True))
            for g, w in zip(got_lines, want_lines, strict=True)
        ):
            return True
    else:
        got_f = [x for x in map(_float, kept) if x is not None]
        want_f = [x for x in map(_float, want) if x is not None]
        if (
            len(got_f) == len(kept)
            and len(want_f) == len(want) == len(got_f)
            and all(abs(a - b) <= 1e-8 + 1e-5 * abs(b) for a, b in zip(got_f, want_f, strict=True))
        ):
            return True
    if not set_rule:
        return False
    # 4. the token-set bug: by now the expected side is its list of stripped non-empty lines (check 2 left
    # it so); each line becomes the set of its tokens, and the sets of those sets are compared
    want_sets = [frozenset(w.split()) for w in want]
    got_sets = [frozenset(o.split()) for o in kept]
    got_sets = [s for s in got_sets if s]
    if set(got_sets) == set(want_sets):
        return True
    try:
        return {frozenset(round(float(t), 3) for t in s) for s in got_sets} == {
            frozenset(round(float(t), 3) for t in s) for s in want_sets
        }
    except ValueError:
        return False
