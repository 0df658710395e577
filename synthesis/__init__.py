"""Phase 2: trace generation (tasks, parsing, verification) over the teacher client in `clients`."""
