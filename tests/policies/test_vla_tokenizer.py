"""The instruction tokenizer: a real transformers tokenizer trained locally, saved and reloaded."""

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from embodrl.errors import UserError
from embodrl.policies.vla.tokenizer import load_tokenizer, tokenize_instructions, train_tokenizer
from tests.policies.vla_testing import INSTRUCTIONS


def test_round_trip_including_unseen_text():
    tokenizer = train_tokenizer(INSTRUCTIONS, 400)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) <= 400
    for text in (*INSTRUCTIONS, "put the ÜBER-mug in the sink 🍵"):  # byte-level: nothing is unknown
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    # Merges learned on the corpus make its instructions shorter than their bytes.
    assert len(tokenizer(INSTRUCTIONS[0])["input_ids"]) < len(INSTRUCTIONS[0].encode())


def test_fixed_length_padding_and_save_load(tmp_path):
    tokenizer = train_tokenizer(INSTRUCTIONS, 400)
    ids, mask = tokenize_instructions(tokenizer, ["pick", INSTRUCTIONS[1] * 5], 12, torch.device("cpu"))
    assert ids.shape == mask.shape == (2, 12)
    assert not mask[0].all() and mask[1].all()  # short one padded, long one truncated
    assert (ids[0][~mask[0]] == tokenizer.pad_token_id).all()
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    again, _ = tokenize_instructions(reloaded, ["pick", INSTRUCTIONS[1] * 5], 12, torch.device("cpu"))
    assert torch.equal(ids, again)


def test_missing_tokenizer_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
