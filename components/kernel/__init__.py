"""The step kernel and its adapters.

``step`` (``Step``, its ports, :meth:`Step.call`) is the kernel: it imports no adapter. The
adapters import it: ``cli`` (``paddle-mlops <step>``), ``dvc`` (``dvc.yaml`` stages) and
``kfp`` (Kubeflow Pipelines components)."""
