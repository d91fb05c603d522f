"""The base of every error a user can act on (bad file, bad flag, a plan that cannot fit).

The CLI prints these as one `error: ...` line, without a traceback, and exits 2 for a
`UsageError` (as argparse does for its own) and 1 for any other; anything else is a bug and
keeps its traceback.
"""

EXIT_FAILED, EXIT_USAGE = 1, 2  # the CLI's statuses for a StrataError and a UsageError


class StrataError(Exception):
    """An error with a message that names what is wrong and, where possible, what to do."""


class UsageError(StrataError):
    """A command line (or the settings standing in for one: a config file's knobs, an
    environment variable) that asks for something no run can do: a flag's value, or flags that
    do not go together. Said before any work, with the flag named; a run that fails on a file,
    the machine or the model is a plain StrataError."""
