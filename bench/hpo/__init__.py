"""The hpo step's local search against an exhaustive grid over the same space (``make bench-hpo``).

On the digits (ingested from ``builtin:digits``, the samples ``data/raw/digits`` holds):

1. **The grid.** Every key of the space (``hpo.space`` of ``--params``) is discretised to a few
   points (:func:`grid_counts`: the ends first, then more points for the keys with the most
   values, while the product stays <= ``--grid``); every config is trained by the search's
   own trial command (the hpo step's, on its train+val view) for ``--epochs`` epochs, no
   pruning, with the params' ``train.seed``. Its results are cached under
   ``build/bench-hpo/grid-<key>.json``, keyed by the code under ``components/``, the params,
   the data's train and val shards and the configs: the same at every repeat and rerun.
2. **The search**, ``--repeats`` times (sampler seeds 0, 1, ...): the hpo step's CLI
   (``python -m components hpo``) with ``hpo.enabled=true`` and the budget, epochs, pruner and
   seed as ``--set`` arguments; a fresh study each time, adoption included (its runs are
   counted apart: they are not search cost).

Per repeat: hpo_vs_grid_best = the search winner's val / the grid's best (the inverse when
lower is better: >= 1 means the search found as good), hpo_cost_vs_grid = trial-epochs the
search's trials ran (pruned ones stop early) / the grid's. Then the min/median/max of each
ratio, and the last line: the medians and ``adopted=yes`` when most repeats adopted.

    .venv/bin/python -m bench.hpo                                  # the defaults (make bench-hpo)
    .venv/bin/python -m bench.hpo --trials 6 --grid 8 --epochs 2 --repeats 1   # a smoke run

Modules: :mod:`bench.hpo.grid` (the grid and its cache key), :mod:`bench.hpo.runs` (the
snapshot, the grid's runs, the searches), :mod:`bench.hpo.cli` (the knobs, the ratios, the lines).
"""
