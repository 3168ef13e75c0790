"""The one exception type for user mistakes.

Library code raises :class:`UserError` for bad input (a missing file, a malformed line, an option out of
range); ``cli.py`` turns it into a one-line message and exit code 2, never a traceback.
"""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input: the message names the file (and line) and the problem."""
