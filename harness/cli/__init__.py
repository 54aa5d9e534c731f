"""``attn-harness``: argument parsing and composition, one module per command.

Nothing outside this package imports it.
"""
