"""Pipeline steps for PaddlePaddle models: one module per step, each a plain function + CLI."""
