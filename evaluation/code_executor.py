"""Code execution for grading model output.

For now this module holds the documented bridge from a full model response to clean code;
the sandbox that executes it against a task's tests lives here too once it is built (see
ARCHITECTURE.md). Extraction is not re-implemented here: it is the same
`utils.thinking_extraction.extract_thinking_and_code_unified` every phase uses.
"""

from __future__ import annotations

from utils.thinking_extraction import extract_thinking_and_code_unified


def extract_function_from_code(response: str | None, reasoning: str | None = None) -> str | None:
    """Clean, executable-looking code from a full response: thinking and fences removed.

    Returns None when the response has no code outside its thinking (including an unclosed,
    truncated thinking block).
    """
    return extract_thinking_and_code_unified(response, reasoning)["code"]
