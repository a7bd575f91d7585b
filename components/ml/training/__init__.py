"""Training's task-independent parts: the run and its checkpoints, data-parallel launch,
export with parity proofs, quantization-aware training and model I/O."""
