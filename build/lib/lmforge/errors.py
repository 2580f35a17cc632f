"""The one exception type users see: a clear, one-line message naming the file, line or field at fault."""


class LmforgeError(Exception):
    """Bad input or state that the user can fix. The CLI prints it as one line, never as a traceback."""
