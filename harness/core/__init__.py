"""The contract and what every other subsystem builds on.

Contract types and errors, attention variants, the DP partition and page
pool, batch building, the metadata validator, the paged backend base, the
backend registry, and small shared utilities (atomic writes, deadlines,
Triton's interpreter switch, text tables). Nothing here imports another
``harness`` subsystem.
"""
