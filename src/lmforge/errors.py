"""The one exception type users see: a clear, one-line message naming the file, line or field at fault."""


class LmforgeError(Exception):
    """Bad input or state that the user can fix. The CLI prints it as one line, never as a traceback."""


class Stopped(Exception):
    """A run stopped on request (SIGINT / SIGTERM) after saving a checkpoint; the message says where.

    The CLI prints it as one line and exits with ``exit_code`` (128 + the signal: 130, 143), as a shell does.
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
