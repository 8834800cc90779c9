"""Autoregressive VLA policy (OpenVLA-style): the VLA prefix, then C*A action tokens over 256 bins.

Sequential decoding samples one token per forward pass with a KV cache; parallel decoding (OpenVLA-OFT)
fills C*A learned placeholder slots in one pass. Both restrict the distribution to the 256 action
tokens (logits from just those LM-head rows: the same as masking every other id, padding included),
then apply temperature and top-k. Log-probs and entropy come from that same processed distribution.
With `conditioning=mlp` an MLP on the observation encoder's features gives the C*A tokens' logits in
one pass instead of the VLA (same bins, sampling, likelihood and replay).
With `policy.cache_frozen_prefix`, OFT decoding and a frozen VLA, `act` stores the slots' hidden states
in replay and `evaluate` applies the LM head's action rows to them (through the slot adapter, when
`policy.autoregressive.slot_adapter` adds one), without running the VLA again.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.autoregressive.action_tokenizer import NUM_ACTION_TOKENS, ActionTokenizer
from embodrl.policies.base import ActOut, EvalOut
from embodrl.policies.config import PolicyConfig
from embodrl.policies.lora import first_trained_layer, group_of, under_top_layers
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder
from embodrl.policies.modules.sft import check_action_batch, masked_mean
from embodrl.policies.vla.modeling import VLABackbone, pool, positions_from_mask, prefix_lm_mask
from embodrl.policies.vla.prefix import (
    VLAPolicy,
    VLAPrefixEncoder,
    check_replay,
    require_bounded_actions,
)

REPLAY_KEYS = ("action_index", "temperature", "top_k")


def processed_log_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Action-token logits [N, T, 256] -> log-probs after temperature [N] and top-k [N] (0: off)."""
    scaled = logits / temperature.view(-1, 1, 1)
    ranked = scaled.sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, (top_k.view(-1, 1, 1) - 1).clamp(min=0).expand(*scaled.shape[:2], 1))
    drop = (top_k.view(-1, 1, 1) > 0) & (scaled < kth)
    return F.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)


def slot_adapter(hidden: int, width: int) -> nn.Sequential:
    """Residual MLP H -> width -> H on a slot's hidden state; its zero output layer leaves the policy as it
    was until it trains."""
    adapter = nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, hidden))
    nn.init.zeros_(adapter[2].weight)
    nn.init.zeros_(adapter[2].bias)
    return adapter


def oft_mask(keys: torch.Tensor) -> torch.Tensor:
    """4D mask [N, 1, T, T] of OFT's bidirectional pass: every position sees every real one (keys [N, T])."""
    n, t = keys.shape
    return keys[:, None, None, :].expand(n, 1, t, t)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of categoricals [..., K] whose filtered classes have log-prob -inf."""
    return -(log_probs.exp() * log_probs.masked_fill(torch.isinf(log_probs), 0.0)).sum(-1)


class AutoregressivePolicy(VLAPolicy):
    """VLA + action tokens; replay stores the token indices and the sampling temperature and top-k."""

    family = "autoregressive"

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        require_bounded_actions(cfg, self.family)
        super().__init__(cfg, obs_shapes)
        self.num_slots = cfg.chunk_size * cfg.action_dim
        acfg = cfg.autoregressive
        self.decoding = acfg.decoding
        self.parallel = self.decoding != "sequential"
        if acfg.conditioning == "mlp":
            self.prefix_encoder = None
            self.encoder = ObsEncoder(cfg, cfg.obs_keys, self.obs_shapes, self.normalizers)
            self.action_tokenizer = ActionTokenizer(NUM_ACTION_TOKENS)  # token indices only: no vocabulary
            self.token_head = mlp(self.encoder.out_dim, acfg.hidden_dims, self.num_slots * NUM_ACTION_TOKENS)
            feature_dim = self.encoder.out_dim
        else:
            self.encoder = None
            self.prefix_encoder = VLAPrefixEncoder(cfg, self.obs_shapes, self.normalizers)
            language = cfg.vla_architecture.language
            hidden = language.hidden_size
            self.action_tokenizer = ActionTokenizer(language.vocab_size)
            self.lm_head = nn.Linear(hidden, language.padded_vocab_size, bias=False)
            if self.decoding == "parallel":
                self.slot_embeddings = nn.Parameter(0.02 * torch.randn(self.num_slots, hidden))  # [C*A, H]
            feature_dim = 2 * hidden
        self.slot_adapter = slot_adapter(hidden, acfg.slot_adapter) if acfg.slot_adapter else None
        self.value_encoder = self._make_value_encoder()
        self.critic = self._make_critic(feature_dim)
        self.aux_head = self._make_aux_head(feature_dim)
        self.to(device)

    @property
    def backbone(self) -> VLABackbone:
        return self.prefix_encoder.backbone

    def adopt_run_settings(self) -> None:
        """Add the slot adapter a run asks for to a checkpoint without one; a checkpoint's own is kept."""
        acfg = self.cfg.autoregressive
        if self.slot_adapter is None:
            if acfg.slot_adapter:
                hidden = self.lm_head.in_features
                self.slot_adapter = slot_adapter(hidden, acfg.slot_adapter).to(self.lm_head.weight.device)
            return
        width = self.slot_adapter[0].out_features
        if acfg.slot_adapter not in (0, width):
            raise UserError(
                f"policy.autoregressive.slot_adapter={acfg.slot_adapter}, but the checkpoint's adapter is "
                f"{width} wide and trained: keep it (0 or {width})"
            )
        self.cfg = dataclasses.replace(self.cfg, autoregressive=dataclasses.replace(acfg, slot_adapter=width))

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., H] -> logits over the 256 action tokens [..., 256] (through the slot adapter
        when there is one)."""
        if self.slot_adapter is not None:
            hidden = hidden + self.slot_adapter(hidden)
        first = self.action_tokenizer.first_token
        return hidden @ self.lm_head.weight[first : first + NUM_ACTION_TOKENS].T

    def _prefix_value(self, obs: TensorDict, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """V from the critic's own encoder, else from the actor's features (mask None: already pooled)."""
        if self.value_encoder is not None:
            return self._value(obs, None)
        return self.critic(hidden if mask is None else pool(hidden, mask))

    def _sampling_params(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        acfg, device = self.cfg.autoregressive, next(self.critic.parameters()).device
        return (
            torch.full((n,), acfg.temperature, device=device),
            torch.full((n,), acfg.top_k, dtype=torch.long, device=device),
        )

    @property
    def caches_slots(self) -> bool:
        """policy.cache_frozen_prefix with OFT decoding on a frozen VLA: the zero slots and the stop token
        add nothing that trains, so the slots' hidden states are a fixed function of the observation.
        `act` stores them and the update runs only the LM head's action rows on them (the head stays in
        the `action_head` LoRA group, untied from the frozen token embeddings). Learned `parallel` slots
        train, so their pass is never cached."""
        return (
            self.cfg.cache_frozen_prefix
            and self.decoding == "oft"
            and self.prefix_encoder is not None
            and self.prefix_encoder.frozen
        )

    @property
    def cached_layer(self) -> int:
        """policy.cache_frozen_prefix with OFT decoding where only the language model's top layers train
        (policy.lora.language_layers) above frozen vision towers: the first trained layer, whose input
        states `act` stores so that the update runs the top layers alone; 0 otherwise."""
        if not (self.cfg.cache_frozen_prefix and self.decoding == "oft" and self.prefix_encoder is not None):
            return 0
        return self._frozen_bottom()

    def _frozen_bottom(self) -> int:
        """The first trained language-model layer when everything under it (vision, projector, embeddings,
        lower layers, state projection) is frozen; 0 when something under the top trains."""
        start = first_trained_layer(self, self.cfg.lora)
        for name, param in self.prefix_encoder.named_parameters(prefix="prefix_encoder"):
            under = group_of(name) == "vision" or under_top_layers(name, start)
            if start == 0 or (param.requires_grad and under):
                return 0
        return start

    def caches_frozen_prefix_part(self) -> bool:
        return super().caches_frozen_prefix_part() or (self.decoding == "oft" and self._frozen_bottom() > 0)

    def _parallel_logits(
        self, obs: TensorDict, augment: bool = False, image_features: TensorDict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One pass over prefix + slots: action logits [N, C*A, 256], prefix hidden and mask (mlp: the
        encoder's features [N, F] and None). `augment`: shift the images at random (SFT);
        `image_features`: a frozen CNN's outputs stored by `act` (mlp conditioning only)."""
        if self.encoder is not None:
            features = self.encoder(obs, augment=augment, image_features=image_features)
            return self.token_head(features).view(-1, self.num_slots, NUM_ACTION_TOKENS), features, None
        slot_hidden, prefix_hidden, prefix_mask = self._slot_states(obs, augment)
        return self.action_logits(slot_hidden), prefix_hidden, prefix_mask

    def _logits_and_slot_cache(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """`caches_slots`' pass: action logits [N, C*A, 256], the pooled prefix features [N, 2H], and what
        the update reads from replay instead: the slots' hidden states, and the pooled features when the
        critic reads the actor's (no value encoder of its own)."""
        slot_hidden, hidden, mask = self._slot_states(obs)
        features = pool(hidden, mask)
        cache = {"slot_hidden": slot_hidden}
        if self.value_encoder is None:
            cache["prefix_features"] = features
        return self.action_logits(slot_hidden), features, cache

    def _slot_inputs(
        self, obs: TensorDict, augment: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """The parallel pass's input: prefix + slot embeddings [N, T, H], which of them are real [N, T], the
        attention mask, the position whose output predicts the first action token, and the prefix's mask
        [N, P]."""
        prefix = self.prefix_encoder(obs, augment)
        n, p = prefix.mask.shape
        if self.decoding == "oft":
            slots = prefix.embeds.new_zeros(n, self.num_slots, prefix.embeds.shape[-1])
            stop = torch.full((n, 1), self.backbone.tokenizer.eos_token_id, device=prefix.mask.device)
            embeds = torch.cat([prefix.embeds, slots, self.backbone.embed_tokens(stop)], dim=1)
            keys = torch.cat([prefix.mask, prefix.mask.new_ones(n, self.num_slots + 1)], dim=1)
            return embeds, keys, oft_mask(keys), p - 1, prefix.mask  # the last prefix token predicts
        slots = self.slot_embeddings.unsqueeze(0).expand(n, -1, -1)
        embeds = torch.cat([prefix.embeds, slots], dim=1)
        keys = torch.cat([prefix.mask, prefix.mask.new_ones(n, self.num_slots)], dim=1)
        return embeds, keys, prefix_lm_mask(prefix.mask, self.num_slots), p, prefix.mask

    def _slot_states(
        self, obs: TensorDict, augment: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The VLA's pass over prefix + slots: the hidden states [N, C*A, H] that predict the action
        tokens, the prefix's hidden states [N, P, H] and its mask [N, P]."""
        embeds, keys, mask, first, prefix_mask = self._slot_inputs(obs, augment)
        hidden = self.backbone(embeds, mask, position_ids=positions_from_mask(keys)).last_hidden_state
        return hidden[:, first : first + self.num_slots], hidden[:, : prefix_mask.shape[1]], prefix_mask

    def _logits_and_layer_cache(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """`cached_layer`'s pass: action logits [N, C*A, 256], the prefix's hidden states [N, P, H], and
        what the update reads from replay instead of rerunning the frozen bottom: the states entering the
        first trained layer and which positions are real."""
        embeds, keys, mask, first, prefix_mask = self._slot_inputs(obs)
        out = self.backbone(embeds, mask, position_ids=positions_from_mask(keys), output_hidden_states=True)
        hidden = out.last_hidden_state
        cache = {"layer_input": out.hidden_states[self.cached_layer], "layer_keys": keys}
        slot_hidden = hidden[:, first : first + self.num_slots]
        return self.action_logits(slot_hidden), hidden[:, : prefix_mask.shape[1]], cache

    def _top_layers_from_cache(self, replay: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The trained top layers over the states `_logits_and_layer_cache` stored: action logits, the
        prefix's hidden states and its mask (the OFT layout: prefix, slots, stop token)."""
        keys = replay["layer_keys"]
        hidden = self.backbone.run_layers_from(
            replay["layer_input"], oft_mask(keys), positions_from_mask(keys), self.cached_layer
        )
        p = keys.shape[1] - self.num_slots - 1
        return self.action_logits(hidden[:, p - 1 : p - 1 + self.num_slots]), hidden[:, :p], keys[:, :p]

    def _teacher_forced_logits(
        self, obs: TensorDict, index: torch.Tensor, augment: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Causal pass over prefix + tokens [N, C*A]: logits predicting each token, prefix hidden, mask;
        `augment`: shift the images at random (SFT)."""
        prefix = self.prefix_encoder(obs, augment)
        n, p = prefix.mask.shape
        tokens = self.backbone.embed_tokens(self.action_tokenizer.to_token(index[:, :-1]))
        embeds = torch.cat([prefix.embeds, tokens], dim=1)
        mask = torch.cat([prefix.mask, prefix.mask.new_ones(n, self.num_slots - 1)], dim=1)
        hidden = self.backbone(embeds, mask.long(), position_ids=positions_from_mask(mask)).last_hidden_state
        return self.action_logits(hidden[:, p - 1 :]), hidden[:, :p], prefix.mask

    def _pick(self, log_probs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return log_probs.argmax(-1)
        return torch.distributions.Categorical(logits=log_probs).sample()

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        n = obs.batch_size[0]
        temperature, top_k = self._sampling_params(n)
        image_features = self.encoder.frozen_image_features(obs) if self.encoder is not None else None
        cache = {}
        if self.parallel:
            if self.caches_slots:
                logits, prefix_hidden, cache = self._logits_and_slot_cache(obs)
                prefix_mask = None  # already pooled
            elif self.cached_layer:
                logits, prefix_hidden, cache = self._logits_and_layer_cache(obs)
                prefix_mask = cache["layer_keys"][:, : prefix_hidden.shape[1]]
            else:
                logits, prefix_hidden, prefix_mask = self._parallel_logits(obs, image_features=image_features)
            log_probs = processed_log_probs(logits, temperature, top_k)  # [N, C*A, 256]
            index = self._pick(log_probs, deterministic)  # [N, C*A]
        else:
            index, log_probs, prefix_hidden, prefix_mask = self._decode_sequentially(
                obs, temperature, top_k, deterministic
            )
        token_logprob = log_probs.gather(-1, index.unsqueeze(-1)).view(n, *self.chunk_shape)
        actions_norm = self.action_tokenizer.to_action(index).view(n, *self.chunk_shape)
        replay = TensorDict(
            {"action_index": index, "temperature": temperature, "top_k": top_k, **cache}, batch_size=[n]
        )
        if image_features is not None:  # frozen CNNs: the update reads their features from here
            replay["image_features"] = image_features
        return ActOut(
            actions=self.normalizers["action"].unnormalize(actions_norm),
            logprob=reduce_logprob(token_logprob, self.cfg.logprob_type),
            value=self._prefix_value(obs, prefix_hidden, prefix_mask),
            replay=replay,
        )

    def _decode_sequentially(
        self, obs: TensorDict, temperature: torch.Tensor, top_k: torch.Tensor, deterministic: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """OpenVLA decoding with a KV cache: token indices [N, C*A] and their log-probs [N, C*A, 256]."""
        prefix = self.prefix_encoder(obs)
        positions = positions_from_mask(prefix.mask)
        out = self.backbone(prefix.embeds, prefix.mask.long(), use_cache=True, position_ids=positions)
        prefix_hidden, mask, position = out.last_hidden_state, prefix.mask.long(), positions[:, -1:]
        hidden = prefix_hidden[:, -1:]
        indices, log_probs = [], []
        for step in range(self.num_slots):
            step_log_probs = processed_log_probs(
                self.action_logits(hidden), temperature, top_k
            )  # [N, 1, 256]
            index = self._pick(step_log_probs, deterministic)  # [N, 1]
            indices.append(index)
            log_probs.append(step_log_probs)
            if step + 1 < self.num_slots:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                token = self.backbone.embed_tokens(self.action_tokenizer.to_token(index))
                position = position + 1
                out = self.backbone(token, mask, cache=out.cache, use_cache=True, position_ids=position)
                hidden = out.last_hidden_state
        return torch.cat(indices, 1), torch.cat(log_probs, 1), prefix_hidden, prefix.mask

    def _logits(
        self,
        obs: TensorDict,
        index: torch.Tensor,
        augment: bool = False,
        image_features: TensorDict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits predicting the C*A tokens `index` [N, C*A] (teacher-forced when sequential)."""
        if self.parallel:
            return self._parallel_logits(obs, augment, image_features)
        return self._teacher_forced_logits(obs, index, augment)

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        check_replay(replay, REPLAY_KEYS, self.family)
        index = replay["action_index"]  # [N, C*A]
        if "slot_hidden" in replay.keys():  # cached by `act` (caches_slots)
            logits = self.action_logits(replay["slot_hidden"])
            prefix_hidden, prefix_mask = replay.get("prefix_features", None), None
        elif "layer_input" in replay.keys():  # cached by `act` (cached_layer)
            logits, prefix_hidden, prefix_mask = self._top_layers_from_cache(replay)
        else:
            logits, prefix_hidden, prefix_mask = self._logits(
                obs, index, image_features=replay.get("image_features", None)
            )
        log_probs = processed_log_probs(logits, replay["temperature"], replay["top_k"])
        token_logprob = log_probs.gather(-1, index.unsqueeze(-1)).view(-1, *self.chunk_shape)
        return EvalOut(
            logprob=reduce_logprob(token_logprob, self.cfg.logprob_type),
            entropy=entropy(log_probs).mean(-1),  # [N], mean per action token
            value=self._prefix_value(obs, prefix_hidden, prefix_mask),
        )

    def value(self, obs: TensorDict) -> torch.Tensor:
        if self.value_encoder is not None:
            return self.critic(self.value_encoder(obs))
        if self.encoder is not None:
            return self.critic(self.encoder(obs))
        prefix = self.prefix_encoder(obs)
        positions = positions_from_mask(prefix.mask)
        hidden = self.backbone(prefix.embeds, prefix.mask.long(), position_ids=positions).last_hidden_state
        return self.critic(pool(hidden, prefix.mask))

    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Cross-entropy of the demo chunk's action tokens (256-way, temperature 1) against the demo's bin,
        or a Gaussian around it (`label_sigma`), ignoring padded steps."""
        target = self.normalizers["action"](check_action_batch(batch, self.chunk_shape))  # [B, C, A]
        index = self.action_tokenizer.to_index(target).flatten(1)  # [B, C*A]
        logits, hidden, mask = self._logits(batch, index, augment=True)  # random image shift, as the others
        nll = F.cross_entropy(logits.flatten(0, 1), self._sft_target(index).flatten(0, 1), reduction="none")
        features = hidden if mask is None else pool(hidden, mask)
        return masked_mean(nll.view_as(target), batch.get("action_is_pad", None)) + self._aux_loss(
            batch, features
        )

    def _sft_target(self, index: torch.Tensor) -> torch.Tensor:
        """Class indices [B, T], or class probabilities [B, T, 256] for a smoothed target."""
        sigma = self.cfg.autoregressive.label_sigma
        if sigma == 0:
            return index
        bins = torch.arange(NUM_ACTION_TOKENS, device=index.device)
        return torch.softmax(-0.5 * ((bins - index.unsqueeze(-1)) / sigma) ** 2, dim=-1)
