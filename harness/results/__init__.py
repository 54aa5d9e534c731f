"""The versioned results file: schema, atomic save, strict load, pytest-benchmark conversion.

Imports ``core`` and ``bench``'s pure statistics only; report and gate read
records through it.
"""
