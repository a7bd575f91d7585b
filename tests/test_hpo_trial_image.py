"""A search trial in the component image, started the way Katib starts it: the trial
container's command and args joined by spaces under ``sh -c``, stdout and stderr redirected to
``/var/log/katib/metrics.log`` and a pid file written on success (Katib's pod webhook, StdOut
collector), the digits snapshot mounted read-only as the trial's data view. Its metrics file
must parse as Katib's collector parses it: one timestamped objective value per epoch.
Skipped, with the reason, where podman is not installed."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import HAVE_PODMAN, NO_PODMAN, REPO
from tests.test_hpo_step import check_katib_metrics, katib_wrapped, trial_argv

CONF = REPO / "containers" / "containers.conf"
pytestmark = pytest.mark.skipif(not HAVE_PODMAN, reason=NO_PODMAN)
LOG_DIR = "/var/log/katib"  # Katib's metrics volume (an emptyDir shared with the collector)


def test_the_trial_command_in_the_image_prints_what_katibs_collector_parses(
    images, digits_data, tmp_path
):
    epochs = 2
    argv = trial_argv("python", "/opt/paddle-mlops/params.yaml", "/view", "/tmp/trial", epochs)
    katib = tmp_path / "katib"  # the emptyDir the collector sidecar reads
    katib.mkdir()
    katib.chmod(0o777)  # the container's uid 10001 writes here
    proc = subprocess.run(
        [
            "podman", "run", "--rm", "--read-only",
            "--tmpfs", "/tmp:mode=1777", "--tmpfs", "/work:mode=1777",
            "-v", f"{digits_data}:/view:ro", "-v", f"{katib}:{LOG_DIR}",
            "-e", "PADDLE_MLOPS_TRIAL=1",  # what the search sets in a trial's environment
            images["components"]["ref"],
            "sh", "-c", katib_wrapped(argv, LOG_DIR),
        ],
        env={**os.environ, "CONTAINERS_CONF": str(CONF)},
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    log = (katib / "metrics.log").read_text() if (katib / "metrics.log").exists() else ""
    assert proc.returncode == 0, (proc.stderr + log)[-4000:]
    assert proc.stdout == ""  # all of the trial's output went to metrics.log
    check_katib_metrics(katib, epochs)
