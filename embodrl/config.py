"""The experiment config: typed dataclasses composed from YAML presets plus `key=value` overrides.

Defaults live only in the dataclasses. A preset in `configs/<group>/<name>.yaml` sets some keys of
one group (`env=tabletop_lang` on the command line picks it); an experiment YAML may pick presets
in its `defaults:` map and set any key. Merge order: dataclass defaults <- group presets <-
experiment body <- command-line `key=value`. OmegaConf does the composition and type checks; this
module turns its exceptions into one-line ConfigErrors that name the key and the valid choices.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from embodrl.algos.config import AlgoConfig
from embodrl.engine.config import EngineConfig
from embodrl.errors import ConfigError
from embodrl.policies.config import PolicyConfig
from embodrl.rewards.config import RewardConfig
from embodrl.sims.config import EnvConfig
from embodrl.structured import load_yaml, merge_to_object
from embodrl.train.config import SFTConfig, TrainConfig
from embodrl.train.intervention_config import InterventionConfig


@dataclass
class ExperimentConfig:
    """One run: what to simulate, which policy, which algorithm, where outputs go."""

    name: str = "default"
    seed: int = 0
    device: str = "cpu"  # "cpu", "cuda", "cuda:1", ...
    run_root: str = "runs"  # outputs go to <run_root>/<name>/<timestamp>/
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)  # the simulator's, or a learned one
    # simulated takeovers by the scripted expert (off-policy training)
    intervention: InterventionConfig = field(default_factory=InterventionConfig)

    def __post_init__(self) -> None:
        if self.intervention.mode != "none" and self.algo.on_policy:
            raise ConfigError(
                f"intervention.mode={self.intervention.mode} feeds the expert's steps to a demo "
                f"buffer, which "
                f"algo.name={self.algo.name} has not: use algo=sac"
            )


def groups() -> dict[str, type]:
    """Config groups: the dataclass-typed fields of ExperimentConfig, e.g. {"env": EnvConfig}."""
    return {
        f.name: f.default_factory().__class__
        for f in dataclasses.fields(ExperimentConfig)
        if f.default_factory is not dataclasses.MISSING
    }


def config_root() -> Path:
    """The `configs/` folder shipped with the package."""
    return Path(str(resources.files("embodrl.configs")))


def presets(group: str) -> list[str]:
    """Names of the YAML presets of one group."""
    return sorted(p.stem for p in (config_root() / group).glob("*.yaml"))


def experiments() -> list[str]:
    return presets("experiment")


def _preset(group: str, name: str) -> DictConfig:
    path = config_root() / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"{group}={name!r} is not a preset; choose one of: {', '.join(presets(group))}")
    return OmegaConf.create({group: load_yaml(path)})


def _experiment_file(experiment: str) -> Path:
    path = Path(experiment)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"experiment file {experiment} does not exist")
        return path
    path = config_root() / "experiment" / f"{experiment}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown experiment {experiment!r}; choose one of: {', '.join(experiments())} or a .yaml path"
        )
    return path


def compose(experiment: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Build a validated ExperimentConfig from an experiment name/path and command-line overrides."""
    group_names = groups()
    selections: dict[str, str] = {}
    key_overrides: list[str] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} must look like key=value (e.g. env.num_envs=16 or env=tabletop_lang)"
            )
        key, value = item.split("=", 1)
        if key in group_names:
            selections[key] = value
        else:
            key_overrides.append(item)

    body = OmegaConf.create()
    if experiment is not None:
        body = load_yaml(_experiment_file(experiment))
        picked = body.pop("defaults", None) or {}
        if not isinstance(picked, dict | DictConfig):
            raise ConfigError(
                f"{experiment}: 'defaults' must map groups to presets, e.g. {{env: tabletop_basic}}"
            )
        for group, name in picked.items():
            if group not in group_names:
                raise ConfigError(
                    f"{experiment}: unknown group {group!r} in defaults; groups: {', '.join(group_names)}"
                )
            selections.setdefault(str(group), str(name))

    group_layers = [_preset(group, name) for group, name in selections.items()]
    return merge_to_object(ExperimentConfig, *group_layers, body, overrides=key_overrides)


def run_config_file(checkpoint: str | Path) -> Path | None:
    """The config.yaml of the run a checkpoint lies in (runs/x/t/checkpoints/last/policy), or None."""
    parents = Path(checkpoint).resolve().parents
    return next((p / "config.yaml" for p in parents if (p / "config.yaml").is_file()), None)


def to_yaml(cfg: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: ExperimentConfig) -> dict:
    """The resolved config as plain nested dicts and lists (what config.yaml holds)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


def make_run_dir(cfg: ExperimentConfig) -> Path:
    """Create runs/<name>/<timestamp>/ and write the fully resolved config into it."""
    run_dir = Path(cfg.run_root) / cfg.name / time.strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while run_dir.exists():  # two runs in the same second get distinct folders
        run_dir = run_dir.with_name(f"{run_dir.name.split('_')[0]}_{suffix}")
        suffix += 1
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir


def remove_unused_run_dir(run_dir: Path) -> bool:
    """Delete a run folder that holds no file but its config.yaml: a run that failed while starting (a
    mistyped task, a missing dataset) leaves nothing to resume, so it should not clutter runs/.
    True when the folder was removed."""
    files = [path for path in run_dir.rglob("*") if path.is_file()]
    if files != [run_dir / "config.yaml"]:
        return False
    shutil.rmtree(run_dir)
    if not any(run_dir.parent.iterdir()):
        run_dir.parent.rmdir()  # runs/<name>/ made for this run alone
    return True
