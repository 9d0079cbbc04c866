"""The one exception type that carries a user-facing message.

Anything raised as ``MemfitError`` is bad input (or an impossible request) and is shown to the user
as one line on stderr with a non-zero exit; anything else is a bug and keeps its traceback.
"""


class MemfitError(ValueError):
    """Bad input or an impossible request, explained in one line."""
