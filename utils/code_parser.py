"""Find the Python program in a model's *answer* text; list what a trusted program defines.

This module only ever sees the answer part of a response: `utils.thinking_extraction` removes
the thinking span first, so code drafted while thinking is never graded. It never executes, compiles
or parses a model's code: whether it compiles is the sandbox's verdict (`syntax_error`).

Block selection rule, decided once (tests/unit/utils/test_code_parser.py covers each case):
1. the **last** fenced block whose language tag is Python (``python``, ``py``, ``python3``,
   ``Python3``, ``py3``; case-insensitive);
2. else the last fenced block with no language tag;
3. else the whole answer, but only if every line that starts at the margin starts like a Python
   statement and one of them is a real statement (a bare word such as ``Hello`` is not a program).
   Decided on the text alone: a model's program is never compiled here (`sandbox` compiles it, in
   its own process; a 200 KB program holds a compiler, and so this process's interpreter lock, for
   seconds), so a raw answer that does not compile is the sandbox's `syntax_error`.
A fence left open at the end of the text (the model stopped before closing it) counts as a
block running to the end; truncated code then fails syntax validation on its own.
Blocks tagged with another language (``bash``, ``text``, ...) are never taken.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from dataclasses import dataclass

from utils.prompts import CODE_FENCE

PYTHON_TAGS = frozenset({"python", "py", "python3", "py3", "python 3"})


@dataclass(frozen=True)
class CodeBlock:
    language: str  # normalized: "python", "" (no tag) or the lower-cased tag as written
    code: str
    closed: bool  # False when the text ended inside the block


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_language(tag: str) -> str:
    tag = tag.strip().lower()
    if tag in PYTHON_TAGS or tag.startswith("python"):
        return "python"
    return tag.split()[0] if tag else ""


def _clean(code_lines: list[str]) -> str:
    # Dedent (models sometimes indent a whole block) and drop blank edges; keep inner layout.
    return textwrap.dedent("\n".join(code_lines)).strip("\n")


def find_code_blocks(text: str) -> list[CodeBlock]:
    """All fenced blocks in order. Line-based: a fence is a line starting with ``` (indent ok)."""
    blocks: list[CodeBlock] = []
    language: str | None = None  # None: outside a block
    body: list[str] = []
    for line in normalize_newlines(text).split("\n"):
        stripped = line.strip()
        if language is None:
            if stripped.startswith(CODE_FENCE):
                language = normalize_language(stripped[len(CODE_FENCE) :].strip("`"))
                body = []
            continue
        if stripped.startswith(CODE_FENCE):
            blocks.append(CodeBlock(language, _clean(body), closed=True))
            language = None
        elif stripped.endswith(CODE_FENCE) and not stripped.endswith("\\" + CODE_FENCE):
            # `return x```` : the closing fence glued to the last code line.
            body.append(line.rstrip()[: -len(CODE_FENCE)])
            blocks.append(CodeBlock(language, _clean(body), closed=True))
            language = None
        else:
            body.append(line)
    if language is not None:
        blocks.append(CodeBlock(language, _clean(body), closed=False))
    return blocks


def check_syntax(code: str) -> tuple[bool, str | None]:
    """(True, None) if `code` compiles as a Python module, else (False, 'line N: message'): for the
    project's own text only (the preflight's canned responses), never a model's, which compiles only in
    the sandbox.

    Uses `compile`, not only `ast.parse`: some errors (`return` outside a function, misplaced
    `nonlocal`) are raised only at compile time.
    """
    try:
        with warnings.catch_warnings():  # invalid escapes etc. are warnings, not errors
            warnings.simplefilter("ignore")
            compile(code, "<solution>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return False, f"line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        return False, f"{type(exc).__name__}: {exc}"
    return True, None


def parse_quietly(code: str) -> ast.Module:
    """ast.parse without SyntaxWarnings (model and MBPP code is full of '\\d' in plain strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(code)


# how a line at the margin of a Python program starts: a statement keyword, a decorator, a comment, an
# assignment, a call, a string (a docstring) or a closing bracket
_STATEMENT_START = re.compile(
    r"(?:def|class|import|from|async|for|while|if|elif|else|try|except|finally|with|return|raise|assert|"
    r"pass|break|continue|global|nonlocal|del|match|case|lambda|yield|await)\b"
    r"|@|#|[)\]}]|[rRbBuUfF]{0,2}['\"]"
    r"|[A-Za-z_][\w.]*(?:\[[^\n]*\])?(?:\s*,\s*[A-Za-z_][\w.]*)*\s*(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)"
    r"|[A-Za-z_][\w.]*\s*\("
)
_REAL_STATEMENT = re.compile(r"(?!#|@|[)\]}]|[rRbBuUfF]{0,2}['\"])")


def looks_like_program(text: str) -> bool:
    """True if every line of `text` at the margin starts like a Python statement and one of them is
    more than a comment or a string. Text only: nothing is compiled (see the module docstring)."""
    margin = [line for line in text.split("\n") if line.strip() and not line[0].isspace()]
    return (
        bool(margin)
        and all(_STATEMENT_START.match(line) for line in margin)
        and any(_REAL_STATEMENT.match(line) for line in margin)
    )


def select_code(answer: str) -> tuple[str | None, str | None, int]:
    """Apply the selection rule to an answer. Returns (code, source, number_of_blocks).

    source is "python_block", "plain_block", "raw_answer" or None (no code found).
    """
    blocks = find_code_blocks(answer)
    for wanted, source in (("python", "python_block"), ("", "plain_block")):
        chosen = [b for b in blocks if b.language == wanted and b.code.strip()]
        if chosen:
            return chosen[-1].code, source, len(blocks)
    if not blocks:
        raw = textwrap.dedent(normalize_newlines(answer)).strip("\n")
        if looks_like_program(raw):
            return raw, "raw_answer", 0
    return None, None, len(blocks)


def find_function_names(code: str) -> list[str]:
    """Top-level function names, and methods of top-level classes as 'Class.method', of a trusted
    program (a reference solution; it parses the code).

    Returns [] for code that does not parse.
    """
    try:
        tree = parse_quietly(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names.extend(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names
