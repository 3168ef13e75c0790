"""What a user reads, above every stage: the tables the command line prints, ``memdpc show``'s pictures and
``memdpc report``'s page (ARCHITECTURE.md §2.7)."""
