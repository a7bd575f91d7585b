"""Fault injection: named failpoints the fault matrix (``make test-faults``) arms through
the environment. A leaf: imports nothing of the project."""
