"""Errors shared by the engine, the services and the CLI."""


class InferixError(Exception):
    """Base class of every error Inferix raises on purpose."""


class UserError(InferixError, ValueError):
    """Bad input from a user: the CLI prints the message as one line, without a traceback.

    The message must say what was wrong and how to fix it.
    """


class CheckpointError(UserError):
    """A checkpoint file is missing, unreadable, or does not match the model."""
