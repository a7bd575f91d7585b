"""The ML libraries, none of them about one task, in four parts (lowest first; a part imports
only itself and the parts below): ``data`` (snapshots, datasets, sources, the prediction log),
``decisions`` (paired gates, blessing, judging, monitoring), ``serving`` (the C++ server, its
runtimes, model config and tuning) and ``training`` (the loop's task-independent parts,
data-parallel launch, export, quantization). Import no step."""
