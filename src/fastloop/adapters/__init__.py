"""The adapters: each implements the run interface once for one kind of loop.

- :mod:`~fastloop.adapters.lightning`: the Lightning callbacks (``callbacks(...)``), with the
  batch-size search (:mod:`~fastloop.adapters.lightning_batch_size`) and the whole-step CUDA
  graph (:mod:`~fastloop.adapters.lightning_graph`); all uses of Lightning's privates are in
  :mod:`~fastloop.adapters._lightning_private`.
- :mod:`~fastloop.adapters.loop`: ``FastLoop`` for a plain PyTorch loop, with its captured step
  (:mod:`~fastloop.adapters.graph_step`).

Users import :mod:`fastloop.lightning` and :mod:`fastloop.loop`.
"""
