"""Baselines: our reproductions of torch Inductor's ``comms.py`` passes, the seed documents commsched was founded on
(see ``/work/shared/seeds/README.md``), kept to compare our own scheduler against. ``sink_waits``, ``raise_comms``
and ``reorder_compute_for_overlap`` are greedy list scheduling (``comm_list_scheduler.py``);
``reorder_communication_preserving_peak_memory`` and ``sink_waits_iterative`` are the iterative swap passes (one
skeleton in ``iterative_common.py``); ``decide_global_ordering_of_comms`` fixes the collectives' order for the passes
after it. ``commsched.passes`` imports every module here, so each registers under torch's name."""
