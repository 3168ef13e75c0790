"""Shared infrastructure every stage uses, importing no other part of memdpc: one-line user errors, atomic
writes, the stream names, wording of messages, the progress bar, interrupts, what a misplaced file looks like,
and the distributed environment (ARCHITECTURE.md §1)."""
