"""The one exception type users see: the CLI prints its message as a single line and exits non-zero."""


class FtplanError(Exception):
    """A problem with the user's input or data files, explained in one line."""
