"""The one error type the CLI turns into a single line and exit code 2."""


class InputError(Exception):
    """Bad user input: the message says what is wrong and how to fix it."""


class RunFailure(Exception):
    """A run stopped for a reason outside the input (e.g. too many workers died): finished samples are saved, the
    message says what happened, and rerunning the same command resumes. Exit code 1."""
