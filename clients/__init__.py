"""Leaf clients of outside services: the OpenAI-compatible HTTP client (`openai_compat`).

A leaf package below every sampler and phase: it imports only `config.py` among the project's modules
(`tests/unit/project/test_layers.py` checks that it imports nothing above the sandbox).
It knows HTTP, retries and the response shapes of OpenAI-compatible servers.
It does not know tasks, prompts or models.

`openai_compat.TeacherClient` is the one transport to such a server.
Phase 2's teacher, on-policy distillation's served teacher (`training.teacher_logprobs`) and the `vllm_server`
rollout backend all use it.
- It wraps an `openai.AsyncOpenAI` client and calls its low-level `post`, to skip per-request typed-dict conversion.
- The client's own retries are off.
  They would also retry a wrong model name's 404, which must fail at once with the served list.
  They know nothing of per-sample error rows either.
- Its own retries (backoff and jitter, transient errors only, never sooner than a `Retry-After` header asks), the
  response shapes it parses and `complete_text` are described in `openai_compat`'s docstring.
"""
