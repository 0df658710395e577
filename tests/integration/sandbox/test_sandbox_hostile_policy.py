"""What a policy under RL stumbles into: programs that are not attacks, but that an ordinary model writes
while it learns, in classes none of the other batteries covers.

Each must get the verdict its behaviour deserves (never a pass it did not earn, never `sandbox_error`,
never a hang) and leave nothing behind for the next program on the same worker. Classes: number
spellings on stdout, ordinary process side effects, stack and recursion, limits hit by accident, and the
value shapes a policy returns. A program that found a weakness says so in its docstring; the others held
and stay as regression tests. `run` (from the isolation battery) checks after every program that no
process or IPC object of it is left.
"""

from __future__ import annotations

import pytest

from sandbox.executor import SandboxPool
from tests.integration.sandbox.test_sandbox_hostile_isolation import LIMITS, assert_pool_healthy, needs_root, run
from tests.task_factory import assert_task, call_task, stdin_task


@pytest.fixture(scope="module")
def pool():
    # one pool for the module: every program here is ordinary code, and the checks after each program
    # (nothing left, the pool healthy) are what must hold between them
    with SandboxPool(workers=1, limits=LIMITS) as p:
        yield p


ADD_ASSERT = assert_task("t/add", "add", "assert add(1, 2) == 3", "assert add(2, 2) == 4")
ADD_CALL = call_task("t/add", "add", ([1, 2], 3), ([2, 2], 4))


# ------------------------------------------------------------------------------------------
# number spellings on stdout: what a model prints for a number that is not the number's spelling
# ------------------------------------------------------------------------------------------

NUMBER_SPELLINGS = {
    # name: (printed, expected, passes)
    "fullwidth_digits_for_an_integer": ("\uff13", "3", False),
    "fullwidth_digits_for_a_float": ("\uff13.\uff15", "3.5", False),
    "arabic_indic_digits_for_a_float": ("\u0663.\u0665", "3.5", False),
    "overflowing_float_for_an_overflowing_expected": ("1e999", "1e400", False),
    "thousands_separator": ("1,000", "1000", False),
    "hex_for_an_integer": ("0x10", "16", False),
    "plus_sign_on_an_integer": ("+16", "16", True),
    "float_in_exponent_form": ("3.5e0", "3.5", True),
}


@pytest.mark.parametrize("name", sorted(NUMBER_SPELLINGS))
def test_number_spellings(pool, name):
    """Found: Python's float() reads any Unicode digit ("\\uff13.\\uff15" is 3.5) and both "1e999" and
    "1e400" are inf, so a wrong spelling (or a wrong overflowing number) matched an expected float; the
    judge now reads ASCII decimal numbers only, and a number that overflows to inf is no number."""
    printed, expected, passes = NUMBER_SPELLINGS[name]
    result = run(pool, f"print({printed!r})\n", stdin_task("t/num", ("", expected)))
    assert result.passed is passes, result
    assert result.status in ("passed", "wrong_answer"), result


# ------------------------------------------------------------------------------------------
# ordinary process side effects: exits, closed streams, redirected stdout, reading input where none is
# ------------------------------------------------------------------------------------------

SIDE_EFFECTS = {
    # name: (program, task, the status it must get)
    "module_level_input_in_an_assert_task": (
        "n = int(input())\ndef add(a, b):\n    return a + b\n",
        ADD_ASSERT,
        "runtime_error",
    ),
    "module_level_exit_in_an_assert_task": (
        "def add(a, b):\n    return a + b\nexit()\n",
        ADD_ASSERT,
        "runtime_error",
    ),
    "exit_inside_the_function": (
        "import sys\ndef add(a, b):\n    sys.exit(a + b)\n",
        ADD_CALL,
        "runtime_error",
    ),
    "closes_the_result_channel_then_returns": (
        "import os\ndef add(a, b):\n    os.close(3)\n    return a + b\n",
        ADD_CALL,
        "runtime_error",
    ),
    "right_answer_then_exit_code_1": (
        "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(1)\n",
        stdin_task("t/add", ("1 2\n", "3\n")),
        "runtime_error",
    ),
    "closes_stdout_before_printing": (
        "import os\nos.close(1)\nprint(3)\n",
        stdin_task("t/add", ("1 2\n", "3\n")),
        "runtime_error",
    ),
    "redirects_stdout_to_a_file": (
        "import sys\nsys.stdout = open('out.txt', 'w')\nprint(3)\n",
        stdin_task("t/add", ("1 2\n", "3\n")),
        "wrong_answer",
    ),
    "reads_past_the_end_of_stdin": (
        "a = input()\nb = input()\nprint(3)\n",
        stdin_task("t/add", ("1 2\n", "3\n")),
        "runtime_error",
    ),
    "prints_the_answer_from_a_thread_after_main_ends": (
        "import threading, time\n"
        "def later():\n    time.sleep(0.2)\n    print(3, flush=True)\n"
        "threading.Thread(target=later).start()\n",
        stdin_task("t/add", ("1 2\n", "3\n")),
        "wrong_answer",
    ),
}


@pytest.mark.parametrize("name", sorted(SIDE_EFFECTS))
def test_ordinary_side_effects_get_their_own_verdict(pool, name):
    code, task, status = SIDE_EFFECTS[name]
    result = run(pool, code, task)
    assert result.status == status, result


@needs_root
def test_a_program_that_stops_itself_still_runs(pool):
    """The program is PID 1 of its namespace: a signal it sends itself without a handler is ignored."""
    code = "import signal\nsignal.raise_signal(signal.SIGSTOP)\nprint(3)\n"
    assert run(pool, code, stdin_task("t/stop", ("", "3"))).passed


def test_waiting_on_a_stopped_child_is_a_timeout_not_a_hang(pool):
    """Waiting uses no CPU time: with tests charged their CPU time, the wall-clock backstop ends it."""
    code = (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None)\npid = libc.fork()\n"
        "if pid == 0:\n    signal.raise_signal(signal.SIGSTOP)\n    libc._exit(0)\n"
        "os.waitpid(pid, 0)\nprint(3)\n"
    )
    result = run(pool, code, stdin_task("t/stop", ("", "3")), limit_s=20)
    assert result.status == "timeout", result


# ------------------------------------------------------------------------------------------
# stack and recursion: what a model does when its recursion is deep
# ------------------------------------------------------------------------------------------


def test_deep_recursion_past_the_c_stack_is_the_programs_crash(pool):
    code = (
        "import sys\nsys.setrecursionlimit(10**7)\n"
        "def add(a, b):\n    return a + b if a <= 0 else 1 + add(a - 1, b)\n"
        "def deep(n):\n    return 0 if n == 0 else 1 + deep(n - 1)\n"
        "deep(10**7)\n"
    )
    result = run(pool, code, ADD_ASSERT)
    assert result.status in ("runtime_error", "memory_limit"), result
    assert_pool_healthy(pool)


def test_huge_thread_stack_is_the_programs_failure(pool):
    code = (
        "import threading\nthreading.stack_size(1 << 30)\nout = []\n"
        "t = threading.Thread(target=lambda: out.append(3))\nt.start()\nt.join()\nprint(out[0])\n"
    )
    result = run(pool, code, stdin_task("t/stack", ("", "3")))
    assert result.status in ("runtime_error", "memory_limit"), result


def test_a_value_nested_past_the_codec_depth_is_a_failure(pool):
    code = "def add(a, b):\n    x = []\n    for _ in range(100_000):\n        x = [x]\n    return x\n"
    result = run(pool, code, ADD_CALL)
    assert not result.passed and result.status != "sandbox_error", result


# ------------------------------------------------------------------------------------------
# limits hit by accident
# ------------------------------------------------------------------------------------------


@needs_root
def test_filling_the_scratch_space_leaves_nothing_for_the_next_program(pool):
    fill = (
        "import os\nk = 0\n"
        "try:\n"
        "    while True:\n"
        "        with open(f'/tmp/fill{k}', 'wb') as f:\n"
        "            f.write(b'x' * (4 << 20))\n"
        "        k += 1\n"
        "except OSError:\n    pass\n"
        "print(k)\n"
    )
    result = run(pool, fill, stdin_task("t/fill", ("", "0")), limit_s=60)
    assert not result.passed and result.status != "sandbox_error", result
    probe = "import os\nprint(len([n for n in os.listdir('/tmp') if n.startswith('fill')]))\n"
    assert run(pool, probe, stdin_task("t/fill", ("", "0"))).passed


def test_running_out_of_file_descriptors_is_a_runtime_error(pool):
    code = "handles = []\nwhile True:\n    handles.append(open('/dev/null'))\n"
    result = run(pool, code, stdin_task("t/fds", ("", "0")))
    assert result.status == "runtime_error", result


def test_debug_prints_in_a_function_task(pool):
    """A policy that prints while it computes: prints and stderr are not judged in a function task, so
    they do not change the verdict; writing past the file size limit fails the write, the program's
    output_limit, never sandbox_error."""
    chatty = (
        "import sys\ndef add(a, b):\n    print('debug', a, b)\n"
        "    sys.stderr.write('x' * (2 << 20))\n    return a + b\n"
    )
    assert run(pool, chatty, ADD_ASSERT).passed
    flood = "import sys\ndef add(a, b):\n    sys.stderr.write('x' * (8 << 20))\n    return a + b\n"
    result = run(pool, flood, ADD_ASSERT)
    assert result.status == "output_limit", result


# ------------------------------------------------------------------------------------------
# the value shapes a policy returns
# ------------------------------------------------------------------------------------------

VALUE_SHAPES = {
    # name: (program, passes): Python's own `==` decides, on decoded data (numpy values keep dtype and shape)
    "numpy_integer": ("import numpy as np\ndef add(a, b):\n    return np.int64(a + b)\n", True),
    # Python: `np.array([3]) == 3` is array([True]), whose truth is True (one element): the reference harness passes it
    "numpy_array_of_one": ("import numpy as np\ndef add(a, b):\n    return np.array([a + b])\n", True),
    "numpy_array_of_two": ("import numpy as np\ndef add(a, b):\n    return np.array([a + b, a + b])\n", False),
    "bool_for_one": ("def add(a, b):\n    return True if a + b == 1 else a + b\n", True),
    "float_for_an_int": ("def add(a, b):\n    return float(a + b)\n", True),
    "generator_for_a_number": ("def add(a, b):\n    return (x for x in [a + b])\n", False),
    "string_for_a_number": ("def add(a, b):\n    return str(a + b)\n", False),
    "counter_subclass_of_int": (
        "class Num(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Num(0)\n",
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(VALUE_SHAPES))
def test_value_shapes_a_policy_returns(pool, name):
    code, passes = VALUE_SHAPES[name]
    result = run(pool, code, ADD_ASSERT)
    assert result.passed is passes, result
    assert result.status in ("passed", "wrong_answer"), result
