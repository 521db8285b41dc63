"""The one error the dev tooling raises for a user to read: never a traceback."""


class StepError(Exception):
    """A step failed; the message says which and what to do."""
