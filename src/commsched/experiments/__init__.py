"""Experiments built on the pipeline, not part of it: ``compare.py`` runs every scheduler (ours, the baselines, the
exact solver, torch's own) on one graph and simulates each alike; ``sweep.py`` runs one preset over parallelisms x
world sizes x hardware profiles (tracing each configuration once) and returns a ``SweepRow`` per configuration. Both
only call the public stages (``workloads.build``, ``cost.estimate_costs``, ``passes.schedule``,
``sim.simulate_costs``); their pictures and tables live in ``report/``."""
