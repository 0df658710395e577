"""Phase 2: the teacher client (transport) and trace generation (tasks, parsing, verification)."""
