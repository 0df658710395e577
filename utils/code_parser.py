"""Find the Python program in a model's *answer* text; list what a trusted program defines.

This module only ever sees the answer part of a response: `utils.thinking_extraction` removes
the thinking span first, so code drafted while thinking is never graded. `select_code`, the rule every
reward and every strict verdict goes through, never executes, compiles or parses a model's code: whether it
compiles is the sandbox's verdict (`syntax_error`).

Block selection rule, decided once (tests/unit/utils/test_code_parser.py covers each case):
1. the candidates are the fenced blocks whose language tag is Python (``python``, ``py``, ``python3``,
   ``Python3``, ``py3``; case-insensitive); if none holds a program, the blocks with no language tag.
   A block holds a program when some line is more than a comment, ``pass`` or ``...``: a copied
   ``# your code`` placeholder is never graded;
2. for a task with a known entry point (`Task.fn_name`: MBPP, HumanEval, APPS call tasks), the **last
   candidate that defines it** (``def name(``, a method of a class included), preceded by the top-level
   definitions, imports and assignments of the other candidates that it uses (directly or through each
   other) and does not define itself; a later block of example calls or asserts does not replace it;
3. else (no entry point, as for stdin programs, or no candidate defines it) the **last** candidate;
4. else the whole answer, but only if every line that starts at the margin starts like a Python
   statement and one of them is a real statement (a bare word such as ``Hello`` is not a program).
Rules 1–3 read the text only: a model's program is never compiled here (`sandbox` compiles it, in
its own process; a 200 KB program holds a compiler, and so this process's interpreter lock, for
seconds), so a raw answer that does not compile is the sandbox's `syntax_error`; "uses" is a word match,
and a top-level segment is the lines from one line at the margin to the next.
A fence left open at the end of the text (the model stopped before closing it) counts as a
block running to the end; truncated code then fails syntax validation on its own.
Blocks tagged with another language (``bash``, ``text``, ...) are never taken.

`sanitize_program` is the second grade, for reporting only (phase 4's sanitized pass@k, never a reward):
the way EvalPlus sanitizes an answer, it keeps the entry point's definition and the definitions, imports
and assignments it reaches, from every candidate block (each cut to its longest parsable prefix), and
drops every top-level call, assert, print and ``if __name__`` block. It parses the answer with `ast`
(no bytecode is made), and only answers of at most `SANITIZE_MAX_CHARS` characters.
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


# a line that is no program: blank, a comment, `pass` or `...`
_NOT_A_STATEMENT = re.compile(r"\s*(?:#.*|pass|\.\.\.)?\s*")
_TOP_LEVEL_NAME = re.compile(r"(?:async\s+)?def\s+(\w+)|class\s+(\w+)|([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
_WORD = re.compile(r"[A-Za-z_]\w*")


def holds_program(code: str) -> bool:
    """True if some line of `code` is more than blank, a comment, `pass` or `...`."""
    return any(not _NOT_A_STATEMENT.fullmatch(line) for line in code.split("\n"))


def defines_entry_point(code: str, entry_point: str) -> bool:
    """True if `code` has a ``def entry_point(`` line (at any indent: a method of a class counts). Text only."""
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M) is not None


def _segments(code: str) -> list[str]:
    """The top-level segments of a block: each runs from a line at the margin to the next one (decorators stay
    with what they decorate); trailing blank lines dropped."""
    segments: list[list[str]] = []
    for line in code.split("\n"):
        at_margin = bool(line.strip()) and not line[0].isspace()
        joins_decorator = segments and all(x.startswith("@") for x in segments[-1] if x.strip())
        if at_margin and not joins_decorator or not segments:
            segments.append([line])
        else:
            segments[-1].append(line)
    return ["\n".join(lines).rstrip() for lines in segments if "".join(lines).strip()]


def _bound_names(segment: str) -> set[str]:
    """The names a top-level segment binds (text only): a def, a class, an import or a plain assignment."""
    head = next((line for line in segment.split("\n") if not line.startswith("@")), "")
    if head.startswith(("import ", "from ")):
        text = " ".join(segment.split())
        if head.startswith("from "):
            text = text.partition(" import ")[2]
        names = set()
        for part in text.replace("(", " ").replace(")", " ").removeprefix("import ").split(","):
            words = part.split()
            if words:
                names.add(words[-1] if len(words) >= 3 and words[-2] == "as" else words[0].split(".")[0])
        return names
    match = _TOP_LEVEL_NAME.match(head)
    return {next(g for g in match.groups() if g)} if match else set()


def _with_used_definitions(chosen: str, others: list[str]) -> str:
    """`chosen`, preceded by the top-level definitions of `others` it uses (transitively) and does not make itself."""
    own = set().union(*(_bound_names(s) for s in _segments(chosen)))
    provider: dict[str, tuple[int, str]] = {}  # name -> (position, segment); the last definition of a name wins
    position = 0
    for code in others:
        for segment in _segments(code):
            for name in _bound_names(segment) - own:
                provider[name] = (position, segment)
            position += 1
    taken: dict[int, str] = {}
    wanted = set(_WORD.findall(chosen)) - own
    while wanted:
        name = wanted.pop()
        if name in provider and provider[name][0] not in taken:
            at, segment = provider[name]
            taken[at] = segment
            wanted |= set(_WORD.findall(segment)) - own
    return "\n\n".join([*(taken[at] for at in sorted(taken)), chosen]) if taken else chosen


def _candidates(answer: str) -> tuple[list[CodeBlock], str | None, int]:
    """(the candidate blocks of rule 1, their source name, the number of fenced blocks)."""
    blocks = find_code_blocks(answer)
    for wanted, source in (("python", "python_block"), ("", "plain_block")):
        chosen = [b for b in blocks if b.language == wanted and holds_program(b.code)]
        if chosen:
            return chosen, source, len(blocks)
    return [], None, len(blocks)


def select_code(answer: str, entry_point: str | None = None) -> tuple[str | None, str | None, int]:
    """Apply the selection rule to an answer. Returns (code, source, number_of_blocks).

    `entry_point` is the task's function name (`Task.fn_name`), None where the task has none (stdin).
    source is "python_block", "plain_block", "raw_answer" or None (no code found).
    """
    chosen, source, num_blocks = _candidates(answer)
    if chosen:
        defining = [n for n, b in enumerate(chosen) if entry_point and defines_entry_point(b.code, entry_point)]
        if defining:
            at = defining[-1]
            others = [b.code for n, b in enumerate(chosen) if n != at]
            return _with_used_definitions(chosen[at].code, others), source, num_blocks
        return chosen[-1].code, source, num_blocks
    if not num_blocks:
        raw = textwrap.dedent(normalize_newlines(answer)).strip("\n")
        if looks_like_program(raw):
            return raw, "raw_answer", 0
    return None, None, num_blocks


SANITIZE_MAX_CHARS = 20_000  # a longer answer is not parsed here: its sanitized program is its strict one
_MAX_CUT_LINES = 200  # how many trailing lines a block may lose to become parsable


def _longest_parsable_prefix(code: str) -> tuple[list[str], ast.Module]:
    """The block's lines and the module of its longest prefix of whole lines that parses (possibly empty)."""
    lines = code.split("\n")
    for end in range(len(lines), max(len(lines) - _MAX_CUT_LINES, 0) - 1, -1):
        try:
            return lines, parse_quietly("\n".join(lines[:end]))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return lines, ast.Module(body=[], type_ignores=[])


def _statement_names(node: ast.stmt) -> set[str]:
    """Names a kept top-level statement binds; empty for one that is dropped (calls, asserts, loops, ifs)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return {node.target.id}
    return set()


def _used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def sanitize_program(answer: str, entry_point: str | None) -> str | None:
    """The answer's program graded EvalPlus-style (see the module docstring); None when there is none.

    Without an entry point (a stdin program is its top-level statements) it is `select_code`'s program.
    """
    strict = select_code(answer, entry_point)[0]
    if not entry_point or len(answer) > SANITIZE_MAX_CHARS:
        return strict
    chosen, _, num_blocks = _candidates(answer)
    codes = [b.code for b in chosen]
    if not codes and not num_blocks and strict is not None:
        codes = [strict]  # rule 4: the raw answer
    kept: dict[str, tuple[tuple[int, int], str, ast.stmt]] = {}  # name -> (position, source, node); last wins
    for block_at, code in enumerate(codes):
        lines, module = _longest_parsable_prefix(code)
        for node in module.body:
            names = _statement_names(node)
            if not names:
                continue
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            source = "\n".join(lines[first - 1 : node.end_lineno]).rstrip()
            for name in names:
                kept[name] = ((block_at, first), source, node)
    if not kept:
        return None
    roots = {entry_point} & kept.keys() or {
        name
        for name, (_, _, node) in kept.items()
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == entry_point for item in node.body
        )
    }
    if not roots:  # the entry point is defined nowhere: every definition, the top-level calls still dropped
        roots = set(kept)
    reached, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in reached or name not in kept:
            continue
        reached.add(name)
        todo.extend(_used_names(kept[name][2]))
    parts = {kept[name][0]: kept[name][1] for name in reached}
    return "\n\n".join(parts[at] for at in sorted(parts))


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
