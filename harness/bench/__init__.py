"""Timing backends against the device's limits and a no-paging peer.

Workloads, the runner, the SDPA peer, the timers, statistics over raw
samples, exact FLOP and byte counts, measured ceilings and the environment
fingerprint. Imports ``core`` and ``numerics``.
"""
