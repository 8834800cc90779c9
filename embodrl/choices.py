"""Validation of enumerated config values, shared by every config dataclass."""

from embodrl.errors import ConfigError


def check_choice(key: str, value: object, choices: tuple) -> None:
    """Raise a one-line ConfigError naming the key and the valid choices."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")
