"""The exit statuses every command, runner and worker shares.

One set, so a CI script reads any command's status the same way: 0 everything
held, 1 something failed (a property, a case, a rank, the gate), 2 the input
was wrong and nothing ran, 130 interrupted (SIGINT, as a shell reports it).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
