"""Errors a user can cause. The CLI prints them as one `error:` line and exits non-zero; tracebacks are for bugs."""


class UserError(Exception):
    """A problem with the user's input (bad file, wrong flag). `exit_code` is what the CLI returns."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class GGUFFormatError(UserError):
    """The input is not a readable GGUF file or shard set (exit 2: unreadable input)."""
