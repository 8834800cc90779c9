"""DSRL-NA: noise-space SAC with noise aliasing (Wagenmaker et al. 2025).

Noise-space SAC (`algo.name=sac` with `algo.noise_policy`) learns Q(s, w) on the one noise w its actor
picked per decision, although many noises decode to nearly the same action chunk. Noise aliasing learns the
value of the decoded actions instead and carries it into the noise space without further env steps:
- the action critic Q^A(s, a) learns by TD on the executed chunks a = decode(s, w), which the replay buffer
  keeps beside the noise, toward r + gamma Q^A(s', decode(s', w')) with w' from the actor (SAC's critic
  step on decoded actions, `algo.utd` of them per update);
- once per update, before the actor's step, the noise critic Q^W(s, w) regresses member by member on
  Q^A(s, decode(s, w)) for fresh noise: half from the steered policy's own N(0, I) (clipped to the bound),
  half from the actor, where its gradient asks;
- the actor climbs Q^W(s, w) - alpha log pi(w | s).
The decoder (train/noise_action_env.py) holds the steered policy, which stays frozen.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.algos.config import AlgoConfig
from embodrl.algos.sac import SAC, ActionDecoder, frozen_mean_q
from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS


class NoiseAliasedSAC(SAC):
    """SAC whose TD critic reads decoded env actions; the actor climbs a noise critic distilled from it."""

    def __init__(self, policy: nn.Module, cfg: AlgoConfig, decoder: ActionDecoder | None = None) -> None:
        if decoder is None:
            raise UserError(
                f"algo.name={cfg.name} steers a frozen flow policy's initial noise: set "
                "algo.noise_policy=CHECKPOINT"
            )
        cameras = [k for k in policy.cfg.read_keys if k in IMAGE_KEYS]
        if cameras:  # the buffer keeps frozen features, while decoding runs the steered policy on images
            raise UserError(
                f"algo.name={cfg.name} decodes stored observations, which hold no images: the steered policy "
                f"reads {cameras}; use algo.name=sac"
            )
        self.decoder = decoder
        super().__init__(policy, cfg)
        self.noise_critic = self.make_critic(math.prod(policy.chunk_shape))
        self.noise_critic_optimizer = torch.optim.Adam(self.noise_critic.parameters(), lr=cfg.critic_lr)

    @property
    def critic_action_size(self) -> int:
        return math.prod(self.decoder.decoded_shape)

    def critic_inputs(
        self, obs: TensorDict, action: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The action critic's inputs for the actor's noise `action`: the chunk it decodes to on `obs`."""
        return super().critic_inputs(obs, self.decoder.decode(obs, action))

    def noise_critic_inputs(
        self, obs: TensorDict, noise: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return super().critic_inputs(obs, noise)

    def replayed_critic_inputs(self, batch: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return super().critic_inputs(batch["obs"], batch["executed_action"])

    def stored_transitions(self, transitions: TensorDict) -> TensorDict:
        """The transitions with the chunks their noise decoded to, which the env executed (the steered policy
        is deterministic): each critic step then decodes only the next decision's noise."""
        transitions["executed_action"] = self.decoder.decode(transitions["obs"], transitions["action"])
        return transitions

    def actor_q(self, obs: TensorDict, action: torch.Tensor) -> torch.Tensor:
        return frozen_mean_q(self.noise_critic, self.noise_critic_inputs(obs, action))

    def actor_step(self, batch: TensorDict) -> dict[str, float]:
        return {**self.distill_step(batch["obs"]), **super().actor_step(batch)}

    def distill_step(self, obs: TensorDict) -> dict[str, float]:
        """One regression of the noise critic on the action critic's values of decoded fresh noise."""
        size, half = obs.batch_size[0], obs.batch_size[0] // 2
        bound = self.cfg.noise_bound
        with torch.no_grad():
            own, _ = self.sample_actions(obs[:half])
            drawn = torch.randn(size - half, *own.shape[1:], device=own.device).clamp(-bound, bound)
            noise = torch.cat([own, drawn])
            target = self.critic(*self.critic_inputs(obs, noise))  # [E, B]
        q = self.noise_critic(*self.noise_critic_inputs(obs, noise))
        loss = (q - target).pow(2).mean()
        self._step(self.noise_critic_optimizer, loss, list(self.noise_critic.parameters()))
        return {"distill_loss": loss.item(), "noise_q": q.detach().mean().item()}

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "noise_critic": self.noise_critic.state_dict(),
            "noise_critic_optimizer": self.noise_critic_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.noise_critic.load_state_dict(state["noise_critic"])
        self.noise_critic_optimizer.load_state_dict(state["noise_critic_optimizer"])
