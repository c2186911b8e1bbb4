"""The zoo: ordinary LightningModules written the way their users write them (not for fastloop),
each a ``FILE.py:make`` target, and beside each an expert's by-hand configuration
(``FILE.py:expert``) in plain Lightning. ``python benchmarks/run.py zoo`` measures the default
``fastloop ladder`` against the expert on each."""
