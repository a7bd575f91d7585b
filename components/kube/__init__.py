"""Everything that talks to Kubernetes and container registries: manifest checks
(``check``), the KServe v2 client (``kserve_client``), image builds and pushes (``images``).
Imports no step."""
