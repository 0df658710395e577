"""Throwaway tasks for the sandbox, judge and prompt tests, one builder per test style (source "t" and
problem "p" unless given), so a test states only what it is about: the entry point and the tests."""

from __future__ import annotations

from typing import Any

from utils.dataset_loader import Task


def assert_task(task_id: str, fn_name: str, *asserts: str, **fields: Any) -> Task:
    """An MBPP-style task: the program defines `fn_name`, each assert is one test."""
    return Task(
        **{"source": "t", "problem": "p", **fields}, task_id=task_id, test_type="assert", fn_name=fn_name, tests=asserts
    )


def stdin_task(task_id: str, *cases: tuple[str, str], **fields: Any) -> Task:
    """An APPS stdin task: one test per (input, expected stdout)."""
    tests = tuple({"input": given, "output": expected} for given, expected in cases)
    return Task(**{"source": "t", "problem": "p", **fields}, task_id=task_id, test_type="stdin", tests=tests)


def call_task(task_id: str, fn_name: str, *cases: tuple[list, Any], **fields: Any) -> Task:
    """An APPS call task: one test per (argument list, expected return value)."""
    tests = tuple({"input": args, "output": expected} for args, expected in cases)
    return Task(
        **{"source": "t", "problem": "p", **fields}, task_id=task_id, test_type="call", fn_name=fn_name, tests=tests
    )
