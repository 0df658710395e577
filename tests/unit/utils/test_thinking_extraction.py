"""One test per extraction rule, on responses shaped like real Qwen3 / vLLM output."""

import pytest

from utils.thinking_extraction import extract_function_from_code, split_thinking
from utils.thinking_extraction import extract_thinking_and_code_unified as extract

IS_PRIME = """import math

def is_prime(n):
    if n <= 1:
        return False
    for d in range(2, math.isqrt(n) + 1):
        if n % d == 0:
            return False
    return True"""

# A typical Qwen3 thinking-mode answer: long thinking with a draft, prose, the final block, notes.
QWEN3_INLINE = f"""<think>
Okay, the user wants a function that checks whether a number is prime. Let me think.

First, numbers less than or equal to 1 are not prime. Then I only need to test divisors up to the
square root of n. A first draft:

```python
def is_prime(n):
    for i in range(2, n):
        if n % i == 0:
            return False
    return True
```

Wait, that is O(n) and wrong for n = 1. Let me use math.isqrt instead.
</think>

To check primality efficiently, test divisors up to the integer square root.

```python
{IS_PRIME}
```

**Explanation:**
- Numbers below 2 are not prime.
- Any composite n has a divisor no larger than sqrt(n)."""


def test_inline_thinking_and_final_python_block():
    r = extract(QWEN3_INLINE)
    assert r.code == IS_PRIME
    assert r.has_thinking and r.think_closed and r.thinking_source == "inline"
    assert r.thinking.startswith("Okay, the user wants") and r.thinking.endswith("math.isqrt instead.")
    assert "<think>" not in r.thinking and "</think>" not in r.thinking
    assert r.code_source == "python_block" and r.num_code_blocks == 1
    assert r.well_formed


def test_code_drafted_inside_thinking_is_never_graded():
    # the only code block outside the thinking is the final one; the draft (range(2, n)) is ignored
    assert "range(2, n)" not in extract(QWEN3_INLINE).code
    only_draft = "<think>\nDraft:\n```python\ndef f():\n    return 1\n```\n</think>\n\nI am not sure."
    r = extract(only_draft)
    assert r.code is None and r.has_thinking and r.think_closed


def test_template_opened_thinking_only_closing_tag():
    # Qwen3's chat template emits "<think>\n" itself, so the completion starts inside the thinking.
    response = "Let me think about primes.\nDivisors up to sqrt(n).\n</think>\n\n```python\n" + IS_PRIME + "\n```"
    r = extract(response)
    assert r.thinking == "Let me think about primes.\nDivisors up to sqrt(n)."
    assert r.thinking_source == "template_opened" and r.think_closed
    assert r.code == IS_PRIME


@pytest.mark.parametrize(
    "cut", ["<think>\nLet me think. n <= 1 is not prime", "<think>\nDraft:\n```python\ndef f(n):\n    return n"]
)
def test_unclosed_think_truncated_yields_no_code(cut):
    r = extract(cut)
    assert r.code is None and not r.has_code
    assert r.has_thinking and not r.think_closed
    assert r.answer == ""


def test_reasoning_delivered_in_a_separate_field():
    # vLLM with --reasoning-parser qwen3: content holds only the answer
    content = "Here is the solution.\n\n```python\n" + IS_PRIME + "\n```"
    r = extract(content, reasoning="Check divisors up to sqrt(n).")
    assert r.thinking == "Check divisors up to sqrt(n)." and r.thinking_source == "field"
    assert r.think_closed and r.code == IS_PRIME and r.well_formed


def test_reasoning_field_with_empty_content_means_cut_off_while_thinking():
    r = extract("", reasoning="Let me think... divisors up to")
    assert r.has_thinking and not r.think_closed and r.code is None


def test_reasoning_field_and_stray_inline_tags_are_both_removed():
    content = "</think>\n\n```python\nx = 1\n```"
    r = extract(content, reasoning="thought")
    assert r.code == "x = 1" and "</think>" not in r.answer


def test_last_python_block_wins_over_earlier_blocks():
    response = (
        "<think>plan</think>\nFirst attempt:\n```python\ndef f(x):\n    return x\n```\n"
        "Improved version:\n```python\ndef f(x):\n    return x * 2\n```\nUsage:\n```bash\npython f.py\n```"
    )
    r = extract(response)
    assert r.code == "def f(x):\n    return x * 2"
    assert r.num_code_blocks == 3


def test_python_block_preferred_over_a_later_untagged_block():
    response = "```python\ndef f():\n    return 1\n```\nOutput:\n```\n1\n```"
    assert extract(response).code == "def f():\n    return 1"


def test_untagged_block_used_when_there_is_no_python_block():
    r = extract("<think>t</think>\n```\ndef g():\n    return 2\n```")
    assert r.code == "def g():\n    return 2" and r.code_source == "plain_block"
    assert not r.well_formed  # the prompt asks for a ```python block


@pytest.mark.parametrize("tag", ["py", "python3", "Python3", "PYTHON", "py3", "python "])
def test_stray_language_tags_count_as_python(tag):
    r = extract(f"```{tag}\ndef h():\n    return 3\n```")
    assert r.code == "def h():\n    return 3" and r.code_source == "python_block"


def test_crlf_response_is_normalized():
    response = QWEN3_INLINE.replace("\n", "\r\n")
    r = extract(response)
    assert r.code == IS_PRIME and "\r" not in r.thinking


def test_mbpp_style_tabs_survive_extraction():
    code = "def f(a):\r\n\tif a:\r\n\t\treturn 1\r\n\treturn 0"
    r = extract(f"```python\r\n{code}\r\n```")
    assert r.code == code.replace("\r\n", "\n")


def test_no_thinking_no_fence_bare_code_is_accepted_only_if_it_is_a_program():
    assert extract("def f(x):\n    return x + 1").code_source == "raw_answer"
    assert extract("Hello").code is None  # compiles as an expression, but is not a program
    assert extract("The answer is 42.").code is None  # prose: no line starts like a statement
    assert extract("Here it is:\ndef f(x):\n    return x").code is None  # prose at the margin


def test_empty_and_none_responses():
    for response in ("", None, "   \n"):
        r = extract(response)
        assert r.code is None and not r.has_thinking and not r.think_closed


def test_several_think_spans_answer_after_the_last_close():
    response = "<think>first</think>\nmiddle ```python\nbad\n```\n<think>second</think>\n```python\nok = 1\n```"
    r = extract(response)
    assert r.code == "ok = 1"
    assert "first" in r.thinking and "second" in r.thinking


def test_think_reopened_after_the_answer_cuts_the_answer():
    response = "<think>a</think>\n```python\nx = 1\n```\n<think>\nhmm, actually\n```python\ny = 2"
    r = extract(response)
    assert r.code == "x = 1" and not r.think_closed and "hmm, actually" in r.thinking


def test_empty_think_block_of_non_thinking_mode():
    # Qwen3 with enable_thinking=False renders an empty think block
    r = extract("<think>\n\n</think>\n\n```python\nz = 3\n```")
    assert not r.has_thinking and r.think_closed and r.code == "z = 3"


def test_unclosed_final_fence_is_taken_and_compiled_in_the_sandbox(pool):
    from sandbox.executor import compile_error

    ok = extract("<think>t</think>\n```python\ndef f():\n    return 1")
    assert ok.code == "def f():\n    return 1" and compile_error(ok.code, pool) is None
    cut = extract("<think>t</think>\n```python\ndef f():\n    return (1 +")
    assert cut.has_code and (compile_error(cut.code, pool) or "").startswith("line")


def test_closing_fence_glued_to_the_last_line():
    assert extract("```python\nx = 1\ny = 2```").code == "x = 1\ny = 2"


def test_split_thinking_preamble_before_think_is_ignored():
    s = split_thinking("Sure!\n<think>reason</think>\nanswer")
    assert s.thinking == "reason" and s.answer == "answer"


def test_extract_function_from_code_is_the_same_extraction():
    assert extract_function_from_code(QWEN3_INLINE) == IS_PRIME
    assert extract_function_from_code("<think>never closed") is None
    assert extract_function_from_code("```python\na = 1\n```", reasoning="r") == "a = 1"


def test_lenient_code_finds_a_program_only_inside_an_unclosed_think():
    from utils.thinking_extraction import lenient_code

    assert lenient_code("<think>x\n```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"
    # a closed think keeps the strict rule: drafted code inside it is still not graded
    assert lenient_code("<think>```python\ndef f():\n    return 1\n```</think>no code") is None
    assert lenient_code("<think>only words") is None
    assert lenient_code("```python\ndef g():\n    return 2\n```") == "def g():\n    return 2"
