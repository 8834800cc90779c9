"""Soft actor-critic with RLPD's recipe (Ball et al. 2023; Haarnoja et al. 2018; REDQ, Chen et al. 2021).

The actor is the policy, trained through `Policy.sample_reparameterized` (a tanh-squashed Gaussian);
the critics live here: an ensemble of Q(s, a) MLPs with LayerNorm, evaluated together as batched
matmuls, on the policy's normalized vector observations, its cameras and the action chunk (env units).
Cameras arrive as the policy's frozen image features (`Policy.frozen_features`), computed once per
observation and stored in the replay buffer (`stored_obs`); each has a small projection in the critic.
One `update` is what one transition earns: `utd` critic steps on fresh batches (each target the minimum
of a random subset of the target critics, minus the entropy term), then one actor and one temperature
step on the last batch (plus, with `bc_weight`, imitation of the batch's demo rows). A chunk is one
decision: its rewards are summed and discounted once.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Protocol

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.algos.config import AlgoConfig
from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS


class EnsembleLinear(nn.Module):
    """`members` independent linear layers applied to inputs [E, B, in] at once (one batched matmul)."""

    def __init__(self, members: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(in_dim)  # nn.Linear's initial range, per member
        self.weight = nn.Parameter(torch.empty(members, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dimension with each member's own gain and bias."""

    def __init__(self, members: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, 1, dim))
        self.bias = nn.Parameter(torch.zeros(members, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


class CriticEnsemble(nn.Module):
    """E Q-functions: inputs [B, in] -> Q-values [E, B]; each hidden layer linear, LayerNorm, ReLU (RLPD)."""

    def __init__(self, members: int, in_dim: int, hidden_dims: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden_dims:
            layers += [EnsembleLinear(members, in_dim, width), EnsembleLayerNorm(members, width), nn.ReLU()]
            in_dim = width
        layers.append(EnsembleLinear(members, in_dim, 1))
        self.net, self.members = nn.Sequential(*layers), members

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs.expand(self.members, *inputs.shape)).squeeze(-1)


class CameraProjection(nn.Module):
    """A camera's frozen feature map [B, C, h, w] -> [B, dim]: a 1x1 convolution to 8 channels, flattened,
    linear, LayerNorm, tanh (DrQ's encoder end), trained by the critic's loss."""

    def __init__(self, shape: tuple[int, ...], dim: int) -> None:
        super().__init__()
        channels = 8
        self.net = nn.Sequential(
            nn.Conv2d(shape[0], channels, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * math.prod(shape[1:]), dim),
            nn.LayerNorm(dim),
            nn.Tanh(),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.float())


class Critic(nn.Module):
    """The Q ensemble on a vector input [B, in] beside projected camera features (one projection per camera,
    shared by the members): Q-values [E, B]."""

    def __init__(
        self,
        members: int,
        vector_dim: int,
        cameras: dict[str, tuple[int, ...]],
        hidden_dims: tuple[int, ...],
        image_dim: int,
    ) -> None:
        super().__init__()
        self.cameras = nn.ModuleDict({k: CameraProjection(shape, image_dim) for k, shape in cameras.items()})
        self.ensemble = CriticEnsemble(members, vector_dim + image_dim * len(cameras), hidden_dims)

    def forward(self, vector: torch.Tensor, cameras: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.cameras[k](cameras[k]) for k in self.cameras]
        return self.ensemble(torch.cat([vector, *parts], dim=-1) if parts else vector)


def frozen_mean_q(critic: nn.Module, inputs: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> torch.Tensor:
    """`critic`'s members' mean Q [B] on `inputs`, with no gradient into the critic: an actor's loss trains
    the actor only."""
    critic.requires_grad_(False)
    try:
        return critic(*inputs).mean(0)
    finally:
        critic.requires_grad_(True)


class ActionDecoder(Protocol):
    """What stands between an actor and the simulator when the actor does not emit env actions: e.g. the
    noise of a frozen flow policy, which `decode` runs (train/noise_action_env.py)."""

    @property
    def decoded_shape(self) -> tuple[int, int]:
        """The env action chunk [C, A] that one actor action becomes."""
        ...

    def decode(self, obs: TensorDict, actions: torch.Tensor) -> torch.Tensor:
        """Env action chunks [B, C, A] (no grad) for the actor's actions [B, ...] on observations `obs`."""
        ...


class SAC:
    """The critic ensemble, its targets, the temperature and the three optimizers around a policy."""

    def __init__(self, policy: nn.Module, cfg: AlgoConfig, decoder: ActionDecoder | None = None) -> None:
        """`decoder`: the env wrapper that turns the actor's actions into the simulator's (noise-space RL),
        when one stands between them; plain SAC's critic reads the actor's own actions and ignores it."""
        self.policy, self.cfg = policy, cfg
        if not policy.can_sample_reparameterized:
            raise UserError(
                f"algo.name={cfg.name} trains the actor through reparameterized samples, which this "
                f"{policy.family} policy does not draw; use policy=gaussian_sac (a tanh-squashed Gaussian)"
            )
        # an asymmetric critic reads policy.value_obs_keys (e.g. privileged state), else the actor's keys
        self.critic_keys = tuple(policy.cfg.value_obs_keys or policy.cfg.obs_keys)
        # cameras reach the learner as the policy's frozen features, which the replay buffer holds instead
        self.camera_keys = tuple(k for k in policy.cfg.read_keys if k in IMAGE_KEYS)
        self.feature_shapes = self._feature_shapes() if self.camera_keys else {}
        action_size = math.prod(policy.chunk_shape)
        self.critic = self.make_critic(self.critic_action_size)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_temperature = torch.tensor(
            math.log(cfg.init_temperature), device=policy.device, requires_grad=True
        )
        self.target_entropy = -float(action_size) if cfg.target_entropy is None else cfg.target_entropy
        value_head = {id(p) for p in policy.critic_parameters()}  # an on-policy V(s) head: SAC leaves it be
        self.actor_parameters = [
            p for p in policy.parameters() if p.requires_grad and id(p) not in value_head
        ]
        self.actor_optimizer = torch.optim.Adam(self.actor_parameters, lr=cfg.actor_lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.temperature_optimizer = torch.optim.Adam([self.log_temperature], lr=cfg.actor_lr)

    @property
    def critic_action_size(self) -> int:
        """How many numbers of action the TD-trained critic reads: the actor's action chunk."""
        return math.prod(self.policy.chunk_shape)

    def make_critic(self, action_size: int) -> Critic:
        """A Q ensemble on the critic's observation keys and an action of `action_size` numbers."""
        policy = self.policy
        vector_dim = sum(policy.obs_shapes[k][0] for k in self.critic_keys if k not in IMAGE_KEYS)
        cameras = {k: self.feature_shapes[k] for k in self.critic_keys if k in IMAGE_KEYS}
        return Critic(
            self.cfg.num_critics,
            vector_dim + action_size,
            cameras,
            self.cfg.critic_hidden_dims,
            self.cfg.critic_image_dim,
        ).to(policy.device)

    def _feature_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of the frozen features that stand in for the cameras in the replay buffer."""
        policy = self.policy
        probe = TensorDict(
            {k: torch.zeros(1, *policy.obs_shapes[k], dtype=torch.uint8) for k in self.camera_keys},
            batch_size=[1],
            device=policy.device,
        )
        features = policy.frozen_features(probe)
        if features is None:
            raise UserError(
                f"algo=sac reads the cameras {list(self.camera_keys)} as frozen image features, computed "
                "once per observation and kept in the replay buffer, which trained image encoders do not "
                "give: use a frozen pretrained tower (policy.vision.tower=efficientnet-lite0) or vector keys"
            )
        return {k: tuple(features[k].shape[1:]) for k in self.camera_keys}

    def stored_obs(self, obs: TensorDict) -> TensorDict:
        """What the replay buffer keeps of env observations: the policy's keys, cameras as frozen features."""
        stored = obs.select(*self.policy.cfg.read_keys)
        if self.camera_keys:
            stored.update(self.policy.frozen_features(obs.select(*self.camera_keys)))
        return stored

    def sample_actions(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's reparameterized actions and log-probs on stored observations."""
        features = obs.select(*self.camera_keys) if self.camera_keys else None
        return self.policy.sample_reparameterized(obs, features)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.detach().exp()

    def critic_inputs(
        self, obs: TensorDict, action: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critic's vector input [B, in] (its vector keys, normalized as the policy normalizes them, and
        the action) and its cameras' cached features."""
        normalizers = self.policy.normalizers
        parts = [
            normalizers[k](obs[k].float()) if k in normalizers else obs[k].float()
            for k in self.critic_keys
            if k not in IMAGE_KEYS
        ]
        cameras = {k: obs[k] for k in self.critic_keys if k in IMAGE_KEYS}
        return torch.cat([*parts, action.flatten(1)], dim=-1), cameras

    def replayed_critic_inputs(self, batch: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critic's inputs for a replay batch's own observations and actions."""
        return self.critic_inputs(batch["obs"], batch["action"])

    def stored_transitions(self, transitions: TensorDict) -> TensorDict:
        """What the replay buffer keeps of one step's transitions [N] (`step_transitions`): all of them."""
        return transitions

    def critic_target(self, batch: TensorDict, generator: torch.Generator) -> torch.Tensor:
        """r + gamma (1 - terminated) (min over a random subset of target Q(s', a') - alpha log pi(a'|s')),
        a' drawn from the policy [B]; at most `algo.q_max` when it is set."""
        with torch.no_grad():
            next_action, next_logprob = self.sample_actions(batch["next_obs"])
            subset = torch.randperm(self.cfg.num_critics, generator=generator)[: self.cfg.critic_subset]
            next_q = self.target(*self.critic_inputs(batch["next_obs"], next_action))[subset].min(0).values
            soft_value = next_q - self.temperature * next_logprob
            target = batch["reward"] + self.cfg.gamma * (~batch["terminated"]).float() * soft_value
            return target if self.cfg.q_max is None else target.clamp(max=self.cfg.q_max)

    def critic_step(self, batch: TensorDict, generator: torch.Generator) -> dict[str, float]:
        target = self.critic_target(batch, generator)
        q = self.critic(*self.replayed_critic_inputs(batch))  # [E, B]
        loss = (q - target).pow(2).mean()  # each critic's MSE, averaged (SB3's 0.5 * sum for E = 2)
        self._step(self.critic_optimizer, loss, list(self.critic.parameters()))
        with torch.no_grad():  # Polyak: target <- (1 - tau) target + tau critic
            torch._foreach_lerp_(list(self.target.parameters()), list(self.critic.parameters()), self.cfg.tau)
        return {"critic_loss": loss.item(), "q": q.detach().mean().item()}

    def actor_step(self, batch: TensorDict) -> dict[str, float]:
        """Maximize the ensemble's mean Q(s, a) - alpha log pi(a|s), a ~ pi; then tune alpha toward the
        target entropy."""
        action, logprob = self.sample_actions(batch["obs"])
        q = self.actor_q(batch["obs"], action)
        actor_loss = (self.temperature * logprob - q).mean()
        metrics = {}
        demo = batch.get("demo", None)
        if self.cfg.bc_weight > 0 and demo is not None and demo.any():
            # imitation of the demo rows' actions (HG-DAgger's labels), beside the RL objective
            bc_loss = (action[demo] - batch["action"][demo]).pow(2).mean()
            actor_loss = actor_loss + self.cfg.bc_weight * bc_loss
            metrics["bc_loss"] = bc_loss.item()
        self._step(self.actor_optimizer, actor_loss, self.actor_parameters)
        temperature_loss = self.temperature_loss(logprob.detach())
        self._step(self.temperature_optimizer, temperature_loss, [self.log_temperature])
        return {
            "actor_loss": actor_loss.item(),
            "entropy": -logprob.detach().mean().item(),
            "temperature": self.temperature.item(),
            **metrics,
        }

    def actor_q(self, obs: TensorDict, action: torch.Tensor) -> torch.Tensor:
        """The ensemble's mean Q(s, a) [B] that the actor climbs, differentiable in `action` only."""
        return frozen_mean_q(self.critic, self.critic_inputs(obs, action))

    def temperature_loss(self, logprob: torch.Tensor) -> torch.Tensor:
        """-log alpha (log pi + target entropy): alpha grows while the entropy is below its target."""
        return -(self.log_temperature * (logprob + self.target_entropy)).mean()

    def update(self, sample: Callable[[], TensorDict], generator: torch.Generator) -> dict[str, float]:
        """One transition's worth of learning: `utd` critic steps, each on a fresh `sample()`, then the actor
        and temperature on the last batch. Returns the last steps' metrics."""
        for _ in range(self.cfg.utd):
            batch = sample()
            metrics = self.critic_step(batch, generator)
        return {**metrics, **self.actor_step(batch)}

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: list[nn.Parameter]) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        optimizer.step()

    def state_dict(self) -> dict:
        return {
            "critic": self.critic.state_dict(),
            "target": self.target.state_dict(),
            "log_temperature": self.log_temperature.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "temperature_optimizer": self.temperature_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.log_temperature.copy_(state["log_temperature"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.temperature_optimizer.load_state_dict(state["temperature_optimizer"])
