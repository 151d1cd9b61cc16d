"""The one exception type users see: the CLI prints its message as a single line and exits non-zero."""


class FtplanError(Exception):
    """A problem with the user's input or data files, explained in one line."""


EXIT_DOES_NOT_FIT = 3  # the answer "no": a script can tell it from bad input (2)


class DoesNotFit(FtplanError):
    """Nothing fits: not in GPU memory even at batch 1, not in host RAM, or not within --max-hours."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, ending a run as Ctrl-C does (its trials ended too), but exiting as a terminated process (143)."""
