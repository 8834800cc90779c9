"""The VecEnv contract: every simulator and adapter returns these TensorDicts, with the observation keys
of embodrl/obs_keys.py (docs/architecture.md, "Contracts")."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from tensordict import TensorDict, tensorclass

from embodrl.errors import UserError


@dataclass(frozen=True)
class ActionSpec:
    """Actions are float32 [N, C, dim]; C (the chunk) is chosen by the caller, any C >= 1."""

    dim: int
    low: float = -1.0
    high: float = 1.0
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorSpec:
    """Shape (without the env dimension) and dtype of one observation key."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@tensorclass
class StepResult:
    """What `VecEnv.step` returns for a batch of N envs after executing a chunk of C actions.

    reward is per executed action [N, C] (zeros after an episode ended inside the chunk); the
    chunk reward is `reward.sum(-1)`. On auto-reset, `obs` is the first observation of the new
    episode and `final_obs` the last one of the finished episode (equal to `obs` elsewhere).
    `episode_flags` holds the env's named per-episode outcomes besides success (`VecEnv.episode_flag_names`;
    none by default): bool [N], True once the event happened in the episode; where `done`, the finished
    episode's. Readers take them where an episode ends, like success.
    """

    obs: TensorDict  # [N]
    reward: torch.Tensor  # [N, C] float32
    terminated: torch.Tensor  # [N] bool: the MDP ended (success or failure); no bootstrap
    truncated: torch.Tensor  # [N] bool: time limit; bootstrap from V(final_obs)
    success: torch.Tensor  # [N] bool
    final_obs: TensorDict  # [N]
    steps_executed: torch.Tensor  # [N] int64: actions of the chunk actually executed
    episode_flags: TensorDict | None = None  # [N] bool per flag name; None in the constructor: no flags

    def __post_init__(self) -> None:
        if self.episode_flags is None:
            self.episode_flags = TensorDict({}, batch_size=self.batch_size, device=self.device)

    @classmethod
    def build(
        cls,
        *,
        obs: TensorDict,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        success: torch.Tensor,
        final_obs: TensorDict,
        steps_executed: torch.Tensor,
        device: torch.device | str | None,
        episode_flags: Mapping[str, torch.Tensor] | None = None,
    ) -> StepResult:
        """The StepResult of these tensors (batch from `reward`), on `device`.

        Half the cost of the constructor (~7 against ~15 us), which sets and checks field by field; paid
        at every env step, the constructor was a tenth of a one-env step's time.
        """
        fields_ = dict(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            final_obs=final_obs,
            steps_executed=steps_executed,
            episode_flags=dict(episode_flags or {}),  # a nested TensorDict, empty for most envs
        )
        return cls.from_tensordict(TensorDict(fields_, batch_size=reward.shape[:1], device=device))

    def with_fields(self, **fields: torch.Tensor | TensorDict) -> StepResult:
        """This result with some of its fields replaced (what env wrappers return)."""
        kept = {
            name: getattr(self, name)
            for name in ("obs", "reward", "terminated", "truncated", "success", "final_obs", "steps_executed")
        }
        return StepResult.build(
            **(kept | fields), device=self.device, episode_flags=dict(self.episode_flags.items())
        )

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated

    def as_tensordict(self) -> TensorDict:
        """The TensorDict holding this result's tensors, for a channel (`to_tensordict` would copy every
        one); `StepResult.from_tensordict` wraps it again."""
        return self._tensordict


class VecEnv(ABC):
    """N environments stepped together; finished ones reset automatically."""

    num_envs: int
    device: torch.device

    @property
    @abstractmethod
    def action_spec(self) -> ActionSpec: ...

    @property
    @abstractmethod
    def observation_spec(self) -> dict[str, TensorSpec]: ...

    @property
    @abstractmethod
    def instruction_table(self) -> list[str]:
        """Every instruction this env can give; obs["task_id"] indexes it."""

    @property
    @abstractmethod
    def num_init_states(self) -> int:
        """Number of distinct initial states addressable by `reset_to`."""

    @property
    def episode_flag_names(self) -> tuple[str, ...]:
        """The keys of every StepResult.episode_flags this env returns; most envs report none."""
        return ()

    @property
    def instruction_tasks(self) -> list[str]:
        """The task of each instruction_table entry, for multi-task suites ([]: one task, or unknown)."""
        return []

    @abstractmethod
    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        """Reset all envs; with a seed the sequence of episodes is reproducible."""

    @abstractmethod
    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        """Reset envs `env_ids` (default all) to initial states `state_ids`; same id -> same state.

        Returns the observation of all N envs (the others unchanged).
        """

    @abstractmethod
    def step(self, actions: torch.Tensor) -> StepResult:
        """Execute an action chunk [N, C, A] open-loop; an episode ending mid-chunk drops the rest."""

    @abstractmethod
    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Video frames uint8 [n, H, W, 3] of envs `env_ids` (default all)."""

    def expert_actions(self) -> torch.Tensor:
        """The scripted expert's next action [N, A] per env, for suites that have one. Reading it advances
        the expert's stages: one read per step."""
        raise UserError(f"suite {type(self).__name__} has no scripted expert; use a tabletop suite for demos")

    def task_progress(self) -> torch.Tensor:
        """[N] in [0, 1]: how far each env's task has come (a shaped potential), where measured."""
        raise UserError(
            f"suite {type(self).__name__} measures no task progress; use intervention.trigger=deviation"
        )

    def instructions(self, task_id: torch.Tensor) -> list[str]:
        """Instruction strings for a [N] tensor of task ids (obs["task_id"])."""
        table = self.instruction_table
        return [table[i] for i in task_id.tolist()]

    def pop_timings(self) -> dict[str, float]:
        """Seconds spent in named parts of stepping and resetting since the last call (e.g. `render`),
        which the engine logs as time/<name> beside time/env_step; most envs report none."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional hook: most envs have nothing to release)
        """Release simulator and renderer resources."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Shared input checks, so every env reports bad input the same way.
    def check_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Validate an action chunk and clip it to the action bounds (documented behaviour)."""
        spec = self.action_spec
        if not isinstance(actions, torch.Tensor):
            raise UserError(
                f"actions must be a torch.Tensor [N, C, {spec.dim}], got {type(actions).__name__}"
            )
        if not actions.is_floating_point():
            raise UserError(f"actions must be floating point [N, C, {spec.dim}], got dtype {actions.dtype}")
        if actions.dim() == 2:  # a single action per env is a chunk of one
            actions = actions.unsqueeze(1)
        if actions.dim() != 3 or actions.shape[0] != self.num_envs or actions.shape[2] != spec.dim:
            raise UserError(
                f"actions must have shape [N={self.num_envs}, C, A={spec.dim}], got {list(actions.shape)}"
            )
        # one reduction per step (a float64 sum is finite iff every float32 element is; half the cost of
        # isfinite().all()); the env indices only on error
        if not math.isfinite(actions.sum(dtype=torch.float64)):
            ids = (~torch.isfinite(actions)).any(dim=-1).any(dim=-1).nonzero().flatten().tolist()
            raise UserError(f"actions contain NaN or inf for env indices {ids}")
        return actions.to(torch.float32).clamp(spec.low, spec.high)

    def check_state_ids(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None) -> torch.Tensor:
        """Validate `reset_to` arguments; returns env_ids (all envs by default)."""
        env_ids = torch.arange(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten()
        state_ids = torch.as_tensor(state_ids).flatten()
        if state_ids.numel() != env_ids.numel():
            raise UserError(f"reset_to got {state_ids.numel()} state ids for {env_ids.numel()} envs")
        out = (state_ids < 0) | (state_ids >= self.num_init_states)
        if out.any():
            raise UserError(
                f"reset_to state ids {state_ids[out].tolist()} out of range [0, {self.num_init_states})"
            )
        if ((env_ids < 0) | (env_ids >= self.num_envs)).any():
            raise UserError(f"reset_to env ids must be in [0, {self.num_envs}), got {env_ids.tolist()}")
        return env_ids
