"""The one exception type that carries a user-facing message.

It lives in the lowest layer so that every layer above can raise it and the
command line can turn it into a clear message and a non-zero exit, never a
traceback.
"""


class DilstoreError(Exception):
    """A problem with the user's input or files, explained in the message."""
