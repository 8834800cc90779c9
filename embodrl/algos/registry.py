"""One registry for advantage estimators, losses and off-policy algorithms, chosen by name in the config.

Entries are "module:attribute" strings resolved on first use, so importing the registry (and the
torch-free AlgoConfig that validates names against it) costs nothing; `register` adds new entries.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from embodrl.choices import check_choice

# kind -> name -> "module:attribute" (or the callable itself once registered in code).
#   advantage:  fn(rollout: TensorDict [T, N], last_value: Tensor [N] | None, cfg) -> AdvantageOut
#   value_loss: fn(error: Tensor, cfg) -> Tensor, elementwise on (return - value)
#   off_policy: class(policy, cfg, decoder=None) of an algorithm that learns from a replay buffer
#               (AlgoConfig.on_policy False): update(sample, generator) -> metrics, state_dict(),
#               load_state_dict(state); `decoder` (algos/sac.py: ActionDecoder) is the env wrapper that
#               turns the actor's actions into env actions, where one stands between them
_ENTRIES: dict[str, dict[str, str | Callable]] = {
    "advantage": {
        "gae": "embodrl.algos.gae:gae_advantages",
        "grpo": "embodrl.algos.grpo:grpo_advantages",
    },
    "value_loss": {
        "mse": "embodrl.algos.ppo_loss:mse_value_loss",
        "huber": "embodrl.algos.ppo_loss:huber_value_loss",
    },
    "off_policy": {
        "sac": "embodrl.algos.sac:SAC",
        "dsrl_na": "embodrl.algos.noise_aliasing:NoiseAliasedSAC",
    },
}

# Estimators that read the critic's values; an algorithm without a critic cannot use them.
CRITIC_ADVANTAGES = frozenset({"gae"})


def names(kind: str) -> tuple[str, ...]:
    """The registered names of one kind ("advantage", "value_loss" or "off_policy")."""
    check_choice("registry kind", kind, tuple(_ENTRIES))
    return tuple(_ENTRIES[kind])


def register(kind: str, name: str, target: str | Callable) -> None:
    """Add (or replace) an entry: `target` is a callable or a "module:attribute" string."""
    check_choice("registry kind", kind, tuple(_ENTRIES))
    _ENTRIES[kind][name] = target


def get(kind: str, name: str) -> Callable:
    """Resolve a registered entry by name; unknown names raise ConfigError listing the valid ones."""
    check_choice(f"algo.{kind}", name, names(kind))
    target = _ENTRIES[kind][name]
    if isinstance(target, str):
        module, attribute = target.split(":")
        target = getattr(importlib.import_module(module), attribute)
        _ENTRIES[kind][name] = target
    return target
