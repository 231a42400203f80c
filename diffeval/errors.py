"""The one error type the CLI turns into a single line and exit code 2."""


class InputError(Exception):
    """Bad user input: the message says what is wrong and how to fix it."""
