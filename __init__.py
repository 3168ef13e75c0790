"""memdpc: self-supervised video representation learning with Memory-augmented Dense Predictive Coding."""

__version__ = "0.1.0"
