"""Commands: the command lines of the libraries, one module per command.

Each module parses its arguments, calls library functions and prints the answer, on
:func:`components.kernel.cli.run_cli` (one error line, exit codes). ``paddle-mlops COMMAND``
imports it by name (:data:`components.kernel.cli.COMMANDS`), so no step's import closure, and
with it no ``dvc.yaml`` dep, includes a command. The libraries (``tracking``, ``kube``) keep
only library functions and never import this room.

- ``registry``: the champion by hand (status, promote, rollback);
- ``fetch_model``: a version's verified bundle into a directory;
- ``verify``: what a registered version's signatures prove;
- ``keys``: make a signing key pair;
- ``sbom``: the CycloneDX SBOM of a local image (``python -m components.commands.sbom``);
- ``connection``: how these commands reach MLflow (``--tracking-uri``, bounded retries).
"""
