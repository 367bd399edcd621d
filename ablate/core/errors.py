"""Errors that mean "the user asked for something invalid": the CLI prints them as one
line and exits with status 2, and nothing is written."""


class ConfigError(ValueError):
    pass
