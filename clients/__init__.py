"""Leaf clients of outside services: the OpenAI-compatible HTTP client (`openai_compat`)."""
