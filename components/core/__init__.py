"""Leaf utilities every room uses: atomic writes and ``StepError`` (``artifacts``), params
files and typed sections (``config``), URIs fit for logs (``uris``). Imports no other room."""
