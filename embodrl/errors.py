"""Errors a user can cause: the CLI prints their message on one line, without a traceback."""


class UserError(Exception):
    """Bad input from a user (config, command line, actions, ids): the message says what to do."""


class ConfigError(UserError):
    """An invalid configuration key, type or value."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that it takes the same path."""
