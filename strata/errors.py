"""The base of every error a user can act on (bad file, bad flag, a plan that cannot fit).

The CLI prints these as one `error: ...` line and exits 1, without a traceback; anything else is
a bug and keeps its traceback.
"""


class StrataError(Exception):
    """An error with a message that names what is wrong and, where possible, what to do."""
