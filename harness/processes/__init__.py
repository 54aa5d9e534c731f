"""Child processes: started in a process group of their own and stopped as a whole tree,
their progress read from structured data they write, never from their output."""
