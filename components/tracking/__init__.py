"""Everything that talks to MLflow: the registry client (``registry``), the logged model and
its pyfunc (``model``), users and permissions (``auth``), run liveness (``liveness``) and
``fetch-model``. Imports no step."""
