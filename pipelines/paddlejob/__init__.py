"""The train step on a Kubeflow training-operator PaddleJob: the pipeline's launcher task.

A pipeline compiled with ``params.yaml: train.distributed.backend: paddlejob`` runs this
component where the train task would be (``pipelines/training.py``); it has the train task's
inputs and outputs (``data``, ``validation``, ``hpo`` in; ``model``, ``checkpoints``,
``metrics``, ``plots`` out), so every later step is wired to it unchanged. In its pod it
first applies the hpo step's adopted params overlay (``hpo/overlay.yaml``) to ``task`` and
``train``, as the train step's ``--hpo`` input does; then it:

1. checks the run's params: ``train.distributed.backend`` is ``paddlejob``,
   ``train.distributed.nnodes``/``nproc``, the ``paddlejob`` section (:class:`PaddleJobParams`);
   with nnodes > 1 ``paddlejob.restart_policy`` must be ``Never`` (the operator restarts only
   the failed pod, while the other ranks stay blocked in a collective and the restarted one
   waits in a rendezvous without a timeout: the job would hang until ``timeout_s``);
2. names the job ``<paddlejob.job_name_prefix>-<12 hex>``, a hash of the KFP run's id
   (the parameter ``run``: ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``, passed by
   ``pipelines/training.py``), of the ``task`` and ``train`` sections and of the data it
   trains on (the train and val shards' pinned sha256, the class names), and records the run
   in the job's annotation ``paddle-mlops/run``. Every KFP retry of the task within one run
   has the same name, so a retry finds its job and its checkpoints;
   another run (a concurrent one, or a rerun) has its own job and its own directory. A job
   whose annotation names another run (or none) is never reused nor deleted: the launch fails
   with an error naming it. (The run in the inputs makes the task's KFP cache key unique to
   the run: it is never a cache hit.);
3. stages what the train step reads of the snapshot (``snapshot.json``, ``labels.json``,
   ``manifest.json`` and the train and val shards, each checked against its pinned sha256; the
   test split stays behind) and a ``params.yaml`` (``task`` + ``train``) into that job's
   directory on the shared ReadWriteMany volume (``paddlejob.pvc`` at ``paddlejob.mount_path``,
   mounted in this pod by the pipeline and in every worker by the PaddleJob);
4. renders ``k8s/paddlejob/paddlejob.yaml`` (Worker replicas = nnodes, the component image by
   digest from ``$PADDLE_MLOPS_IMAGE`` (``$PADDLE_MLOPS_GPU_IMAGE`` with GPUs) or
   ``paddlejob.image``, resources from ``params.yaml: resources.train`` (compiled in), GPUs per
   worker as limits of ``paddlejob.accelerator``, runPolicy) and checks it with
   ``components.kube.check`` (the CRD's schema, the hardening policy, a real digest);
5. creates it with the official ``kubernetes`` client (in-cluster config, else the kubeconfig:
   ``$KUBECONFIG``, context ``paddlejob.kube_context``). If a job of that name exists (a retry
   whose previous attempt died before its cleanup: SIGKILL, OOM, a lost node) it is reused when
   it belongs to this run, has the same spec (annotation ``paddle-mlops/spec-sha256``) and has
   not failed, else deleted and created again; the train step resumes from the checkpoints;
6. waits at most ``paddlejob.timeout_s``, polling every ``paddlejob.poll_interval_s``: each new
   status condition is logged, and the new lines of every pod's log (pods selected by the
   operator's label ``training.kubeflow.org/job-name``) go to this task's log. It fails fast
   when a pod cannot start (a container waiting with ErrImagePull, ImagePullBackOff,
   InvalidImageName, CreateContainerConfigError or CreateContainerError: the error names the
   pod, the reason and its message) and when a pod stays unschedulable (condition PodScheduled
   False, reason Unschedulable) for ``paddlejob.unschedulable_timeout_s`` (with the scheduler's
   message). Failed status reads (no answer, HTTP 429 or 5xx) are retried for
   ``paddlejob.api_outage_s``; then the launcher stops with an error that names the job and
   says it was left running: it does not delete it, and a retry of the task reattaches to it;
7. on ``Succeeded`` copies model, checkpoints, metrics and plots (global rank 0 wrote them to the
   job's directory) into the output artifacts, before any cleanup; on ``Failed``, a pod that
   cannot start or the timeout raises ``StepError`` naming the job and the reason (and the end
   of each pod's log);
8. then deletes the PaddleJob it created or reused (its pods and Services go with it; the
   delete carries the job's uid as a precondition, so it never deletes another object of the
   name), unless ``paddlejob.keep_job``, or the API could not be read (6.), or the job belongs
   to another run (2.). After a success a failed deletion is logged, not raised (the outputs are
   the task's already; ``ttlSecondsAfterFinished`` removes the job), and the job's directory is
   removed unless ``paddlejob.keep_run_dir``; after a failure it stays (the checkpoints a retry
   resumes from). A failure in any step from 3. on (staging included) is cleaned up the same
   way.

SIGTERM (KFP cancels the run, the launcher's pod is evicted or deleted) stops the launcher:
it deletes the job first (a cancel must not leave GPU pods running; at most
:data:`TERM_API_TIMEOUT_S` s per request) and only then fetches the pods' last log lines, for at
most :data:`TERM_LOGS_S` s, so the termination grace period (30 s by default) is not spent on
logs. A SIGKILL leaves the job to a retry of the task (5.), or to ``activeDeadlineSeconds`` and
the TTL.

The operator's env contract (training-operator release-1.9,
``pkg/controller.v1/paddlepaddle/envvar.go``): with Worker replicas only (collective mode)
``PADDLE_MASTER`` is worker 0's own pod IP (``$(POD_IP_DUMMY)``, from the downward API):<port
named master> in worker 0 and ``<job>-worker-0:<port>`` in the others, ``PADDLE_NNODES`` the
number of replicas, ``PADDLE_JOB_ID`` the job's name, and ``PYTHONUNBUFFERED=0`` (a non-empty
value, which Python takes as ``-u`` all the same: unbuffered). The template has no Master
replica on purpose: with one the operator runs its parameter-server mode (it adds
``PADDLE_SERVER_NUM``/``PADDLE_TRAINER_NUM``, which make ``paddle.distributed.launch`` start
PS training instead of collective data parallel).

Identity: the pipeline runner's ServiceAccount needs create/get/list/watch/delete on
``paddlejobs`` (kubeflow.org) and get/list on ``pods`` and ``pods/log``
(``k8s/pipelines/rbac.yaml``: Role ``paddle-mlops-paddlejob``).
"""

from pipelines.paddlejob.api import (
    ApiError,
    Kube,
    api_client,
    api_message,
    owner,
    request_errors,
)
from pipelines.paddlejob.component import (
    kfp_main,
    paddlejob_component,
    paddlejob_train_op,
)
from pipelines.paddlejob.launcher import (
    TERM_API_TIMEOUT_S,
    TERM_LOGS_S,
    ForeignJob,
    LaunchResult,
    Terminated,
    ensure_job,
    launch,
    overlaid,
)
from pipelines.paddlejob.spec import (
    CONTAINER,
    GPU_IMAGE_ENV,
    GROUP,
    IMAGE_ENV,
    JOB_NAME_LABEL,
    KIND,
    MAX_PREFIX,
    MOUNT_ENV,
    PLURAL,
    PORT_NAME,
    PVC_ENV,
    REPLICA_TYPE,
    REPO,
    RESOURCE_FIELDS,
    RUN_ANNOTATION,
    RUN_DIR_ENV,
    SHARED_VOLUME,
    SHM_VOLUME,
    SPEC_ANNOTATION,
    TERMINAL,
    VERSION,
    Outputs,
    PaddleJobParams,
    Topology,
    check_restart_policy,
    check_run,
    container_resources,
    load_template,
    render,
    spec_sha256,
    template_path,
    topology,
    typed,
    worker_image,
)
from pipelines.paddlejob.volume import (
    OUTPUTS,
    STAGED_FILES,
    STAGED_SPLITS,
    collect,
    job_key,
    missing_outputs,
    stage,
)
from pipelines.paddlejob.watch import (
    NOT_STARTING,
    SYSTEM_CLOCK,
    Clock,
    JobLeftRunning,
    PodLogs,
    PodStates,
    conditions,
    kubelet_timestamp,
    terminal,
    terminal_view,
    wait,
)

__all__ = [
    "ApiError",
    "CONTAINER",
    "Clock",
    "ForeignJob",
    "GPU_IMAGE_ENV",
    "GROUP",
    "IMAGE_ENV",
    "JOB_NAME_LABEL",
    "JobLeftRunning",
    "KIND",
    "Kube",
    "LaunchResult",
    "MAX_PREFIX",
    "MOUNT_ENV",
    "NOT_STARTING",
    "OUTPUTS",
    "Outputs",
    "PLURAL",
    "PORT_NAME",
    "PVC_ENV",
    "PaddleJobParams",
    "PodLogs",
    "PodStates",
    "REPLICA_TYPE",
    "REPO",
    "RESOURCE_FIELDS",
    "RUN_ANNOTATION",
    "RUN_DIR_ENV",
    "SHARED_VOLUME",
    "SHM_VOLUME",
    "SPEC_ANNOTATION",
    "STAGED_FILES",
    "STAGED_SPLITS",
    "SYSTEM_CLOCK",
    "TERMINAL",
    "TERM_API_TIMEOUT_S",
    "TERM_LOGS_S",
    "Terminated",
    "Topology",
    "VERSION",
    "api_client",
    "api_message",
    "check_restart_policy",
    "check_run",
    "collect",
    "conditions",
    "container_resources",
    "ensure_job",
    "job_key",
    "kfp_main",
    "kubelet_timestamp",
    "launch",
    "load_template",
    "missing_outputs",
    "owner",
    "paddlejob_component",
    "paddlejob_train_op",
    "render",
    "request_errors",
    "spec_sha256",
    "stage",
    "template_path",
    "terminal",
    "terminal_view",
    "topology",
    "typed",
    "wait",
    "worker_image",
    "overlaid",
]
