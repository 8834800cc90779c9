"""Typed config loading through OmegaConf structured configs, with one-line errors for user mistakes.

Shared by the experiment config (embodrl.config) and the deploy configs, so every command reports
an unknown key, a wrong type or an invalid value the same way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from embodrl.errors import ConfigError


def load_yaml(path: Path | str) -> DictConfig:
    """A YAML mapping, or a ConfigError naming the file."""
    try:
        cfg = OmegaConf.load(path)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:  # a syntax error: name the file, line and column, on one line
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a config file must be a YAML mapping")
    return cfg


def explain(e: OmegaConfBaseException) -> ConfigError:
    """OmegaConf's multi-line exception as a one-line ConfigError naming the key (and valid keys)."""
    key = e.full_key or str(e.key)
    reason = str(e.msg).splitlines()[0]
    if isinstance(e, ConfigKeyError) and dataclasses.is_dataclass(e.object_type):
        valid = ", ".join(f.name for f in dataclasses.fields(e.object_type))
        return ConfigError(f"unknown config key {key!r}; valid keys here: {valid}")
    if reason.startswith("Cannot convert 'DictConfig'"):  # `key.sub=value` given for a plain value
        return ConfigError(f"{key} is a single value, not a group of keys: write {key}=VALUE")
    return ConfigError(f"{key}: {reason}")


def check_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise ConfigError(f"overrides {bad} must look like key=value (e.g. env.num_envs=16)")


def merge_to_object(cls: type, *layers: Any, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Instantiate dataclass `cls` from its defaults, then each layer, then `key=value` overrides."""
    check_overrides(overrides)
    # `key=` is the empty string, as in Hydra (OmegaConf's dotlist reads it as null)
    overrides = [f"{item}''" if item.endswith("=") else item for item in overrides]
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(cls), *layers, OmegaConf.from_dotlist(overrides))
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise explain(e) from None


def load_structured(cls: type, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()):
    """Dataclass `cls` from an optional YAML file plus `key=value` overrides."""
    return merge_to_object(cls, *([load_yaml(path)] if path else []), overrides=overrides)
