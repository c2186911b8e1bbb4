"""The ladder (``fastloop ladder``): find the fastest *measured* configuration for a model it has
never seen. One package, one owner of its state:

- :mod:`~fastloop.drivers.ladder.run`: the entry, :func:`run_ladder` (inputs checked, speedups
  parsed once, the search the mode names);
- :mod:`~fastloop.drivers.ladder.state`: :class:`~fastloop.drivers.ladder.state.LadderState`, the
  only writer of what the ladder measured, kept and said, its comparisons, its end (the final
  comparison and the document); its budget, :mod:`~fastloop.drivers.ladder.budget`; its rungs,
  :mod:`~fastloop.drivers.ladder.rung`;
- the searches, one protocol: :mod:`~fastloop.drivers.ladder.search` (the staged search, the
  default), its moves (:mod:`~fastloop.drivers.ladder.moves`: measure, decide, record) and sizes
  (:mod:`~fastloop.drivers.ladder.sizing`); :mod:`~fastloop.drivers.ladder.sequential` (one
  rung at a time);
- what is not measured and why, :mod:`~fastloop.drivers.ladder.gates`; the candidates' groups
  and order, :mod:`~fastloop.drivers.ladder.candidates`; every sentence of the document,
  :mod:`~fastloop.drivers.ladder.wording`.

Example:
    >>> from fastloop.drivers.ladder import default_rungs
    >>> "workers" in default_rungs("cpu")
    True
"""

from fastloop.drivers.ladder.candidates import select_order
from fastloop.drivers.ladder.run import DEFAULT_RUNGS, default_budget, default_measure_s, default_rungs, run_ladder

__all__ = ["DEFAULT_RUNGS", "default_budget", "default_measure_s", "default_rungs", "run_ladder", "select_order"]
