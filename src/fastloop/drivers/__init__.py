"""The drivers behind the command line: each measures configurations and writes a document.

- :mod:`~fastloop.drivers.runner` (``fastloop run``: one configuration, its document in
  :mod:`~fastloop.drivers.run_document`);
- :mod:`~fastloop.drivers.ladder` (``fastloop ladder``), a package: its entry, its state and
  budget, its searches (staged, sequential), its gates and its words;
- :mod:`~fastloop.drivers.ab` (``fastloop ab``), :mod:`~fastloop.drivers.fit` (``fastloop fit``, ``ab --fit``),
  :mod:`~fastloop.drivers.doctor` (``fastloop doctor``); ``fastloop batch-size`` runs
  :func:`fastloop.speedups.batch_size.search_batch_size`;
- :mod:`~fastloop.drivers.targets` (``FILE.py:FUNCTION`` and the recipes' short names);
- the process runner :mod:`~fastloop.drivers.subproc` with its fork server
  :mod:`~fastloop.drivers.forkserver`, and :mod:`~fastloop.drivers.exits` (Ctrl-C, a failed peer).
"""
