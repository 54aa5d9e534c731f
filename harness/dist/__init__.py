"""Real multi-process DP over torch.distributed: ``attn-harness dist`` and its parts.

``coordination`` (token counts, padding, graph sizes), ``schedule`` (each
rank's seeded requests), ``worker`` (one rank's engine loop), ``check``
(rank 0's oracle and shared-pool checks), ``launcher`` (the watchdog),
``faults`` (planted failures) and ``scaling`` (the DP scaling benchmark).
"""
