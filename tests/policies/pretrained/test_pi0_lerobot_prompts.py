"""Prompts of pi0 / pi0.5 checkpoints trained with LeRobot's processors (LeRobot 0.4.4): the pi0 instruction
as given plus a newline, the pi0.5 state zero-padded to max_state_dim before it is discretized.
scripts/pi0_parity.py checks the whole chain against LeRobot itself."""

import numpy as np
import pytest
import torch

from embodrl.policies.flow.vla_flow import make_prompts
from embodrl.policies.pretrained.pi0 import export_pi0, import_pi0
from tests.policies.pretrained.pi0_testing import write_checkpoint


def lerobot_pi05_prompt(task: str, state: np.ndarray, max_state_dim: int) -> str:
    """Pi05PrepareStateTokenizerProcessorStep of LeRobot 0.4.4, restated."""
    padded = np.pad(state, (0, max_state_dim - len(state)))
    bins = np.digitize(padded, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "


def test_pi0_instruction_as_given_when_not_cleaned():
    tasks = [" push the blue_cube ", "stack\n"]
    assert make_prompts("pi0", tasks, None, clean=False) == [" push the blue_cube \n", "stack\n"]
    assert make_prompts("pi0", tasks, None) == ["push the blue cube\n", "stack\n"]


def test_pi05_state_padded_before_discretizing_as_lerobot_does():
    state = torch.tensor([[-1.2, -0.3, 0.0, 0.51, 0.999, 1.5]])
    prompt = make_prompts("pi05", ["pick_up the cube"], state, state_dim=32)[0]
    assert prompt == lerobot_pi05_prompt("pick_up the cube", state[0].numpy(), 32)
    assert prompt.count(" 128") >= 26  # 26 padded zeros fall in bin 128
    assert make_prompts("pi05", ["a"], state)[0].count(" ") < prompt.count(" ")  # openpi: unpadded


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_lerobot_import_keeps_lerobot_prompts_and_openpi_import_does_not(tmp_path, variant):
    write_checkpoint(tmp_path / "lerobot", variant, "lerobot")
    write_checkpoint(tmp_path / "openpi", variant, "openpi")
    lerobot = import_pi0(tmp_path / "lerobot", fmt="lerobot").cfg.flow
    openpi = import_pi0(tmp_path / "openpi", fmt="openpi").cfg.flow
    assert not lerobot.clean_instruction and openpi.clean_instruction
    assert lerobot.prompt_state_dim == (32 if variant == "pi05" else 0)
    assert openpi.prompt_state_dim == 0


def test_lerobot_pi05_prompt_width_survives_export_and_import(tmp_path):
    write_checkpoint(tmp_path / "src", "pi05", "lerobot")
    policy = import_pi0(tmp_path / "src", fmt="lerobot")
    policy.cfg.flow.prompt_state_dim = 24  # as if LeRobot's max_state_dim were 24
    export_pi0(policy, tmp_path / "out", fmt="lerobot")
    assert import_pi0(tmp_path / "out", fmt="lerobot").cfg.flow.prompt_state_dim == 24
