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


OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
EMPTY_TOKEN = "▁"  # Llama's lone-space piece (id 29871), which OpenVLA appends after "Out:"


def tokenize_openvla_prompts(
    tokenizer: PreTrainedTokenizerFast, instructions: Sequence[str], length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenVLA's prompt: BOS ids [N, 1], and the prompt ids after BOS ending in the empty token, left-padded
    to `length` [N, L] with their mask [N, L] bool (OpenVLA lowercases the instruction)."""
    empty = tokenizer.convert_tokens_to_ids(EMPTY_TOKEN)
    if empty is None or empty == tokenizer.unk_token_id or tokenizer.bos_token_id is None:
        raise UserError(
            f"the tokenizer has no {EMPTY_TOKEN!r} piece or no BOS token: the openvla prompt format needs "
            "the checkpoint's Llama tokenizer (tokenizer.json)"
        )
    ids = torch.zeros(len(instructions), length, dtype=torch.long)
    mask = torch.zeros(len(instructions), length, dtype=torch.bool)
    for row, instruction in enumerate(instructions):
        prompt = OPENVLA_PROMPT.format(instruction=instruction.lower())
        tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not tokens or tokens[-1] != empty:
            tokens.append(empty)
        if len(tokens) > length:
            raise UserError(
                f"the OpenVLA prompt for {instruction!r} has {len(tokens)} tokens; set "
                f"policy.vla.max_instruction_tokens >= {len(tokens)}"
            )
        ids[row, length - len(tokens) :] = torch.tensor(tokens)
        mask[row, length - len(tokens) :] = True
    bos = torch.full((len(instructions), 1), tokenizer.bos_token_id, dtype=torch.long)
    return bos.to(device), ids.to(device), mask.to(device)


def read_instructions(obs, instruction_table: Sequence[str]) -> list[str]:
    """The N instruction strings of an observation: obs["instruction"] when present (deploy, datasets),
    else obs["task_id"] looked up in the env's instruction table saved with the policy (rollouts),
    so rollout buffers stay all-tensor."""
    if "instruction" in obs.keys():
        return list(obs["instruction"])
    if "task_id" in obs.keys() and instruction_table:
        ids = obs["task_id"].tolist()
        if max(ids, default=0) >= len(instruction_table) or min(ids, default=0) < 0:
            raise UserError(
                f"task ids {sorted(set(ids))} are outside the policy's {len(instruction_table)} instructions "
                "(policy.vla.instructions): the policy was trained on another env's instruction table"
            )
        return [instruction_table[i] for i in ids]
    raise UserError(
        "a VLA policy needs obs['instruction'] (N strings), or obs['task_id'] with policy.vla.instructions"
    )
