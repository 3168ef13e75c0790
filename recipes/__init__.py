"""The paper's experiments as recipes (one YAML file a table row, beside their loader) and settings files
(ARCHITECTURE.md §5)."""
