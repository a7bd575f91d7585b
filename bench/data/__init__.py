"""Data layer benchmark: memory as the data set grows, ingest vs bare decoding, the streaming
reader vs the train step, incremental ingest, the train step reading shards vs in memory. Every
ratio is measured side by side in one run.

Data: generated image folders of RGB 64x64 JPEGs, 10 classes (noise plus a class-dependent
shape: 5 shapes x 2 colours at random places and sizes, so a model learns something),
deterministic from ``--seed`` (image i of class c depends only on (seed, c, i)). They are
cached under ``--cache-dir`` (build/bench-data) and reused between runs: one generated
folder per resolution, and one folder per size made of hard links to its first images.

1. **Peak RSS per step and size** (``--sizes``: 2,000, 8,000 and 32,000 images). For each
   size the real CLI runs each step as its own process, exactly as dvc.yaml calls it
   (``python -m components ingest|validate|train|export|evaluate --params <generated>``;
   task ``image_folder``, resnet18 at 64x64, ``ingest.kind: image_folder``, ``image_mode:
   RGB``; train 1 epoch at ``--batch-size``). Evaluate scores the export directly
   (``--bundle`` = the export's output: it holds the fp32 program evaluate runs); qat and
   package are not run (evaluate reads only the fp32 model from the bundle). Each step's
   memory is read two ways: **max RSS**, the kernel's high-water mark of the largest single
   process of the step (``wait4`` rusage: what ``/usr/bin/time -v`` prints as "Maximum
   resident set size"; ingest's pool workers are included, they are waited for), and **tree
   RSS**, the peak of the summed RSS of the step's process tree, sampled every 50 ms
   (psutil). ``rss_growth_16x`` = the worst step's max RSS at the largest size over the
   smallest (32k/2k: 16x the data); export is shown but is not one of the four steps of the
   goal (ingest, validate, train, evaluate).
2. **Ingest vs bare decode** at ``--throughput-size`` (default: the largest size), both with
   ``--workers`` processes: (a) ``components.steps.ingest.run`` (``ingest.workers`` = N) into a
   fresh directory; (b) a ``multiprocessing`` spawn pool of N doing only the decode of the
   same files (read bytes, ``PIL.Image.open(...).convert("RGB")``, ``np.asarray``) in
   chunks of ``ingest.unit_files`` files. Each runs in its own fresh process and is timed
   *inside* it, from after the imports (``components.steps.ingest``, the task: paddle) to the
   end: Python start-up and imports are not ingest work. Pool start-up (spawn) is inside
   both timings, as it is part of the work. ``--repeats`` rounds, decode and ingest
   alternating; ``ingest_vs_decode`` = the median of the rounds' decode_time / ingest_time.
3. **Reader vs train step**, in one fresh process on the snapshot of ``--reader-size``
   (default 8,000), one pass over the train split each: (a) ``components.tasks.data.
   iter_split`` (``batch_rows`` = the batch size) with each batch through
   ``task.preprocess``, in this process; (b) the train step's own input pipeline where it
   has one (``components.tasks.stream.SnapshotData(...).batches``: ``train.loader_workers``
   DataLoader processes, the shuffle buffer, with the params' ``train`` settings); (c) the
   train step's samples/s (resnet18 at 64x64, Adam, cross-entropy: forward, backward and
   optimizer step on real preprocessed batches of ``--batch-size``, after 3 warm-up steps,
   ``--train-steps`` timed, paddle's default threads). ``reader_vs_train`` = (b) / (c), or
   (a) / (c) where there is no (b). The train step's own ``metrics/train.json`` figures
   (``reader_samples_per_second``, ``samples_per_second``) are printed beside it.
4. **Incremental ingest** at ``--incremental-size`` (default: the largest size): a folder
   linking the first N images is ingested in full (timed as in 2.), then +10% new images
   arrive as a new dated sub-folder per class (``<class>/2026-12-03/*.jpg``) and ingest runs
   again into the SAME output directory (unchanged units reuse their shards).
   ``incremental_ingest`` = time(incremental) / time(full), and ``rerun_no_change`` =
   time(rerun with nothing changed) / time(full): the medians of ``--repeats`` rounds, each
   from scratch. The bench asserts (and prints), in every round,
   that every shard of the old snapshot is in the new one under the same path with the same
   sha256, its bytes hashed again, and that every old sample (key) is in the same split.
5. ``--big``: 100,000 RGB 224x224 images (not in CI, not by default): ingest and validate
   (``--big-steps``) with their peak RSS; ``rss_100k_224_mb`` = the largest. Train and
   evaluate need a params knob that bounds them (a full ResNet epoch at 224^2 takes hours on
   2 cores): add them to ``--big-steps`` with ``--big-set train.<knob>=<n>`` once it exists.
6. **Train step reading shards vs in memory** (``--scenarios train_vs_memory`` runs it alone),
   in a fresh process per data set: digits (the repo's params.yaml, ``builtin:digits``) and
   the 64x64 folder of ``--train-memory-size`` images (default 500, resnet18).
   Two fresh models of the same seed train ``--train-memory-epochs`` epochs each, alternately
   epoch by epoch: (a) the train step's own pipeline (``Inputs``, its reader and piece cache,
   ``Inputs.batches``, ``Trainer.epoch``); (b) the same ``Trainer.epoch`` on batches of the
   split preprocessed once and held in memory. ``train_vs_memory`` = samples/s (a) / (b), the
   worse data set.

    .venv/bin/python bench/data_bench.py                # 2k/8k/32k (make bench-data)
    .venv/bin/python bench/data_bench.py --quick        # 500/2000 images: a CI smoke run
    .venv/bin/python bench/data_bench.py --big          # + 100k RGB 224x224
    .venv/bin/python bench/data_bench.py --set validate.workers=2 --json out.json

The last line printed is machine-readable::

    rss_growth_16x=R ingest_vs_decode=D reader_vs_train=T incremental_ingest=I rss_100k_224_mb=M \
    train_vs_memory=V

(one line, folded here; ``na`` for what was not measured, e.g. ``rss_100k_224_mb`` without
``--big``, or a scenario left out of ``--scenarios``).

The parts: :mod:`bench.data.common` (constants, the environment of every child process),
:mod:`bench.data.corpus` (the generated images), :mod:`bench.data.params` (the params.yaml of
each run), :mod:`bench.data.steps` (one pipeline step as its own process, its RSS sampled),
:mod:`bench.data.workers` (the measurements made in a fresh process of this benchmark),
:mod:`bench.data.measurements` (ingest vs decode, incremental ingest),
:mod:`bench.data.scenarios` (the scenario table), :mod:`bench.data.report` (what is printed
and written) and :mod:`bench.data.cli` (the command line). ``bench/data_bench.py`` (``make
bench-data``) and ``python -m bench.data`` both run :func:`bench.data.cli.main`.
"""
