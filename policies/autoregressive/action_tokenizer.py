"""OpenVLA's action tokenizer: normalized actions in [-1, 1] <-> 256 bins <-> the last 256 vocabulary ids."""

from __future__ import annotations

import torch

NUM_ACTION_TOKENS = 256


class ActionTokenizer:
    """Bin edges linspace(-1, 1, 256): token = V - digitize(a), decoded to the centre of its bin.

    Follows openvla's prismatic/vla/action_tokenizer.py exactly (so OpenVLA checkpoints decode the same):
    256 token classes, 255 distinct bin centres (the two lowest-action tokens share a centre).
    `index` is a token's position among the action tokens: token = first_token + index.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # V: real vocabulary size; action tokens are ids [V - 256, V)
        self.first_token = vocab_size - NUM_ACTION_TOKENS
        self.edges = torch.linspace(-1.0, 1.0, NUM_ACTION_TOKENS)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2  # [255]

    @property
    def bin_width(self) -> float:
        return 2.0 / (NUM_ACTION_TOKENS - 1)

    def to_index(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalized actions [...] -> action-token indices [...] int64 in [0, 255]."""
        edges = self.edges.to(actions.device)
        digitized = torch.bucketize(actions.clamp(-1.0, 1.0).contiguous(), edges, right=True)  # np.digitize
        return NUM_ACTION_TOKENS - digitized  # token V - d, minus first_token

    def to_action(self, index: torch.Tensor) -> torch.Tensor:
        """Action-token indices [...] -> normalized actions [...] (bin centres)."""
        centers = self.centers.to(index.device)
        return centers[(NUM_ACTION_TOKENS - 1 - index).clamp(0, NUM_ACTION_TOKENS - 2)]

    def to_token(self, index: torch.Tensor) -> torch.Tensor:
        """Action-token indices -> vocabulary ids."""
        return index + self.first_token
