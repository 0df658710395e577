"""Phase 2's statistics: how many answers the token budget cut after the thinking had closed."""

from __future__ import annotations

from synthesis.generate_traces import TeacherTrace, TraceStats


def trace(finish: str, response: str, reasoning: str | None = None) -> TeacherTrace:
    return TeacherTrace(
        task_id="t/1", sample_idx=0, prompt="p", finish_reason=finish, response=response, reasoning=reasoning
    )


def test_answers_cut_after_the_thinking_closed_are_counted_apart_from_thinking_that_never_closed():
    stats = TraceStats()
    stats.add(trace("length", "", reasoning="long thinking the server ended at the budget"))  # nothing after: no
    stats.add(trace("length", "Here is the code:\n```python\ndef f(", reasoning="thinking"))  # forced, then cut: yes
    stats.add(trace("length", "<think>a</think>\n```python\nx = ("))  # inline thinking closed, answer cut: yes
    stats.add(trace("length", "<think>still thinking"))  # never closed: no
    stats.add(trace("stop", "<think>a</think>\n```python\nx = 1\n```"))  # whole: no
    assert (stats.truncated, stats.cut_after_thinking) == (4, 2)
    table = stats.table()
    assert "cut after </think>:" in table and "raise teacher.max_tokens" in table
    assert stats.to_dict()["cut_after_thinking"] == 2
