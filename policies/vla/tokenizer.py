"""Instruction tokenizer: a byte-level BPE trained with `tokenizers`, as a `transformers` tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from embodrl.errors import UserError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")


def train_tokenizer(instructions: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `instructions` (may be empty: bytes only) and wrap it for `transformers`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(instructions), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer written by `save_pretrained` (local files only, never the Hub)."""
    if not (Path(directory) / "tokenizer.json").is_file():
        raise UserError(f"{directory} has no tokenizer.json; it is not a checkpoint of a language policy")
    return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)


def tokenize_instructions(
    tokenizer: PreTrainedTokenizerFast, instructions: Sequence[str], length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Instruction ids right-padded/truncated to a fixed `length`: ids [N, L] int64 and mask [N, L] bool."""
    encoded = tokenizer(
        list(instructions),
        padding="max_length",
        truncation=True,
        max_length=length,
        return_tensors="pt",
    )
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device=device, dtype=torch.bool)
