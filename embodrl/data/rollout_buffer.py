"""The rollout buffer: one TensorDict [T, N] of decisions, and shuffled minibatches over its T*N samples."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tensordict import TensorDict

from embodrl.choices import check_positive

# What `add` needs per decision, each with batch [N] (shapes after N):
#   obs             TensorDict  observation the policy acted on
#   actions         [C, A]      float32
#   logprob         [] | [C] | [C, A]  at the policy's logprob_type (chunk, action, token)
#   value           []          V(obs); zeros without a critic
#   replay          TensorDict  what Policy.evaluate needs to recompute logprob
#   reward          [C]         per executed action, zeros after an episode's end inside the chunk
#   steps_executed  []          int64, actions of the chunk executed before the episode ended
#   terminated, truncated, success  []  bool
#   episode_flags   TensorDict  the env's episode flags, [] bool each (StepResult.episode_flags; may be empty)
#   bootstrap_value []          V(final_obs) where truncated (read nowhere else; zeros are fine)
TRANSITION_KEYS = (
    "obs",
    "actions",
    "logprob",
    "value",
    "replay",
    "reward",
    "steps_executed",
    "terminated",
    "truncated",
    "success",
    "episode_flags",
    "bootstrap_value",
)


class RolloutBuffer:
    """Fixed-size storage of T decisions of N envs, allocated from the first transition's shapes."""

    def __init__(self, num_steps: int, num_envs: int, device: torch.device | str = "cpu") -> None:
        check_positive("num_steps", num_steps)
        check_positive("num_envs", num_envs)
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.data: TensorDict | None = None  # [T, N]; estimators add advantages, returns, mask, ...
        self.last_value: torch.Tensor | None = None  # [N] V(obs after the last decision), for GAE
        self._leaf_keys: list[str | tuple[str, ...]] = []  # the transition's leaves, allocated in data
        self._leaves: list[torch.Tensor | None] = []  # data's tensors of those leaves
        self._step_views: list[tuple[torch.Tensor, ...]] = []  # per leaf, its views [N, ...] of every step
        self.step = 0

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    def add(self, transition: TensorDict) -> None:
        """Store one decision of all N envs (keys in TRANSITION_KEYS, batch [N]) at the next step."""
        if self.full:
            raise RuntimeError(f"the rollout buffer holds {self.num_steps} steps; call clear() first")
        if tuple(transition.batch_size) != (self.num_envs,):
            raise ValueError(f"transition batch {tuple(transition.batch_size)} != ({self.num_envs},)")
        if self.data is None:
            missing = [key for key in TRANSITION_KEYS if key not in transition.keys()]
            if missing:
                raise KeyError(f"transition lacks {missing}; a transition holds {list(TRANSITION_KEYS)}")
            transition = transition.select(*TRANSITION_KEYS).to(self.device)
            self.data = transition.unsqueeze(0).expand(self.num_steps, self.num_envs).clone()
            self._leaf_keys = list(transition.keys(include_nested=True, leaves_only=True))
            self._leaves, self._step_views = [None] * len(self._leaf_keys), [()] * len(self._leaf_keys)
        if self.step == 0:  # the update may have replaced leaves (PPO stores scaled rewards)
            self._refresh_views()
        sources = [transition.get(key, None) for key in self._leaf_keys]
        if any(source is None for source in sources):
            missing = [key for key, source in zip(self._leaf_keys, sources, strict=True) if source is None]
            raise KeyError(f"transition lacks {missing}; a transition holds {list(TRANSITION_KEYS)}")
        # leaf by leaf in one call: TensorDict's indexed assignment walks the nesting each time, which
        # costs 3x as much, a tenth of a one-env decision
        torch._foreach_copy_([views[self.step] for views in self._step_views], sources)
        self.step += 1

    def _refresh_views(self) -> None:
        """Per leaf, its T step views, made once (indexing every leaf at every step cost ~8 us a
        decision); remade for a leaf that something replaced since."""
        for i, key in enumerate(self._leaf_keys):
            leaf = self.data.get(key)
            if leaf is not self._leaves[i]:
                self._leaves[i], self._step_views[i] = leaf, leaf.unbind(0)

    def set_last_value(self, value: torch.Tensor) -> None:
        """V [N] of the observation after the last decision, which GAE bootstraps from."""
        self.last_value = value.detach().to(self.device)

    def clear(self) -> None:
        """Start a new rollout, keeping the allocated storage."""
        self.step = 0
        self.last_value = None

    def minibatches(
        self, minibatch_size: int, generator: torch.Generator, keys: Sequence[str] | None = None
    ) -> Iterator[TensorDict]:
        """One epoch: every one of the T*N samples exactly once, shuffled by `generator` (CPU); with
        `keys`, minibatches hold only those keys (cutting fewer tensors per minibatch).

        The last minibatch is smaller when minibatch_size does not divide T*N.
        """
        if not self.full or self.data is None:
            raise RuntimeError(f"the rollout holds {self.step} of {self.num_steps} steps; fill it first")
        check_positive("algo.minibatch_size", minibatch_size)
        data = self.data if keys is None else self.data.select(*keys)
        flat = data.reshape(-1)  # [T*N]
        order = torch.randperm(flat.batch_size[0], generator=generator).to(self.device)
        for start in range(0, order.numel(), minibatch_size):
            yield flat[order[start : start + minibatch_size]]
