"""Serving: the C++ server as a process or a local service, the Paddle Inference and OpenVINO
runtimes, the bundle's model config and warm-up, the KServe v2 client, load generation, the
serving-config search and infra validation."""
