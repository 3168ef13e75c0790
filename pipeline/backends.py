"""The loader backends' names, in a module without torch so that the command line can offer them quickly."""

__all__ = ["BACKENDS"]

BACKENDS = ("auto", "dali", "torch")
