"""The task record, and reading/writing task files from every source.

Every phase reads tasks only through this package. A task is one programming problem with its
tests stored as data, in one of three test styles:

- ``assert`` (MBPP): ``tests`` is a list of assert statements. ``test_imports`` run before the
  program, ``test_setup_code`` runs *after* the program (MBPP's setup code uses classes that the
  solution defines) and before the asserts.
- ``stdin`` (APPS standard-input problems): ``tests`` is a list of ``{"input": str, "output": str}``.
- ``call`` (APPS problems with ``fn_name``): ``tests`` is a list of ``{"input": [args...],
  "output": value}``; ``fn_name`` is a plain function or a method of ``class Solution``.

Loaders convert the original schemas to this record:
- MBPP, full schema (``text, code, task_id, test_setup_code, test_list, challenge_test_list``) or
  sanitized (``prompt, code, task_id, test_imports, test_list``), from the hub
  (``google-research-datasets/mbpp``) or a local ``.jsonl``/``.json``/``.parquet`` file. The
  reference code keeps its CRLF line endings and tabs (Python accepts both).
- APPS, ``codeparrot/apps`` schema (``problem_id, question, solutions`` (JSON string),
  ``input_output`` (JSON string), ``difficulty, url, starter_code``), from the hub's plain
  ``train.jsonl``/``test.jsonl`` files (the repository's loading script is refused by
  ``datasets>=4``) or a local ``.jsonl``/``.parquet``. Inputs/outputs given as lists of lines are
  joined with newlines (stdin problems); call-based expected values are kept as stored, including
  Codewars' one-element-list wrapping (the sandbox accepts ``out == exp`` or ``out == exp[0]``).
  Problems without usable tests are skipped and counted in a `LoadReport`, never silently.

One file per part: `task` (the record, its checks, task files), `rows` (raw rows and what loaders share),
`mbpp`, `apps`, `mapped` (any dataset through a column mapping), `humaneval`, and `splits` (the embedded
fixtures, the seeded sample and split). Import from the package: every name is re-exported here.

What this package does not know: how tests are executed (sandbox.executor) or how a
prompt is worded (utils.prompts).
"""

from __future__ import annotations

from utils.dataset_loader.apps import APPS_DIFFICULTIES, APPS_HUB_ID, apps_row_to_task, load_apps
from utils.dataset_loader.humaneval import (
    HUMANEVAL_PACKAGE,
    HUMANEVAL_VERSION,
    humaneval_data_file,
    humaneval_row_to_task,
    humaneval_tests,
    load_humaneval,
)
from utils.dataset_loader.mapped import MAPPABLE_FIELDS, load_mapped_dataset, mapped_row_to_task, parse_field_map
from utils.dataset_loader.mbpp import (
    MBPP_HUB_ID,
    MBPP_STANDARD_TEST_IDS,
    entry_point_from_asserts,
    load_mbpp,
    mbpp_original_split,
    mbpp_row_to_task,
)
from utils.dataset_loader.rows import (
    SUPPORTED_SUFFIXES,
    LoadReport,
    build_task,
    hub_error,
    keep_distinct,
    read_rows,
    require_columns,
)
from utils.dataset_loader.splits import (
    EMBEDDED_APPS,
    EMBEDDED_DIR,
    EMBEDDED_MBPP,
    dataset_name_note,
    seeded_sample,
    split_tasks,
    task_sort_key,
)
from utils.dataset_loader.task import (
    TEST_TYPES,
    TUPLE_FIELDS,
    Task,
    TaskSchemaError,
    read_tasks,
    require_tasks,
    validate_task,
    write_tasks,
)
from utils.jsonl import DataFormatError

__all__ = [
    "dataset_name_note",
    "APPS_DIFFICULTIES",
    "APPS_HUB_ID",
    "DataFormatError",
    "EMBEDDED_APPS",
    "EMBEDDED_DIR",
    "EMBEDDED_MBPP",
    "HUMANEVAL_PACKAGE",
    "HUMANEVAL_VERSION",
    "LoadReport",
    "MAPPABLE_FIELDS",
    "MBPP_HUB_ID",
    "MBPP_STANDARD_TEST_IDS",
    "SUPPORTED_SUFFIXES",
    "TEST_TYPES",
    "TUPLE_FIELDS",
    "Task",
    "TaskSchemaError",
    "apps_row_to_task",
    "build_task",
    "entry_point_from_asserts",
    "hub_error",
    "humaneval_data_file",
    "humaneval_row_to_task",
    "humaneval_tests",
    "keep_distinct",
    "load_apps",
    "load_humaneval",
    "load_mapped_dataset",
    "load_mbpp",
    "mapped_row_to_task",
    "mbpp_original_split",
    "mbpp_row_to_task",
    "parse_field_map",
    "read_rows",
    "read_tasks",
    "require_columns",
    "require_tasks",
    "seeded_sample",
    "split_tasks",
    "task_sort_key",
    "validate_task",
    "write_tasks",
]
