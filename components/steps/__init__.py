"""The pipeline steps, one module each, each ending in ``STEP = Step(...)``.

A step imports the kernel, the libraries and the tasks, never another step
(``tests/test_architecture.py``)."""
