"""Export: TorchScript/ONNX programs reproduce act(deterministic=True), load without embodrl; VLAs refused."""

import json
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from embodrl.convert import convert
from embodrl.deploy.export import export_policy
from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy
from tests.policies import vla_testing

N, C, A, S, P = 5, 3, 4, 6, 2  # N differs from the traced batch (2): the batch dimension must stay dynamic
SHAPES = {"state": (S,), "privileged": (P,), "rgb": (24, 24, 3), "task_id": ()}
OBS_KEYS = ("rgb", "state", "task_id", "privileged")
FAMILIES = {
    "gaussian": dict(family="gaussian", gaussian={"hidden_dims": (32, 32)}),
    "flow": dict(family="flow", flow={"hidden_dims": (32, 32), "num_steps": 3}),
}


def checkpoint(family: str, directory) -> torch.nn.Module:
    torch.manual_seed(0)
    data = dict(
        chunk_size=C,
        action_dim=A,
        obs_keys=list(OBS_KEYS),
        num_tasks=3,
        cnn_channels=(8, 8),
        **FAMILIES[family],
    )
    policy = make_policy(PolicyConfig.from_dict(data), SHAPES)
    policy.set_normalization(
        {
            "state": compute_stats(torch.randn(100, S) * 3 + 1),
            "privileged": compute_stats(torch.randn(100, P)),
            "action": compute_stats(torch.rand(100, A) * 0.5 + 2),
        }
    )
    policy.save_pretrained(directory)
    return policy.eval()


def observation() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "rgb": torch.randint(0, 256, (N, *SHAPES["rgb"]), generator=g, dtype=torch.uint8),
        "state": torch.randn(N, S, generator=g) * 3 + 1,
        "task_id": torch.tensor([0, 1, 2, 1, 0]),
        "privileged": torch.randn(N, P, generator=g),
    }


def reference(policy, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """act(deterministic=True)'s actions [N, C, A] and the program inputs that must reproduce them."""
    torch.manual_seed(7)
    actions = policy.act(TensorDict(obs, batch_size=[N]), deterministic=True).actions
    inputs = tuple(obs[key] for key in OBS_KEYS)
    if policy.family == "flow":
        torch.manual_seed(7)
        inputs += (torch.randn(N, C, A),)  # the x0 act drew
    return actions, inputs


STANDALONE = """
import sys, torch
files = {"export.json": ""}
program = torch.jit.load(sys.argv[1], _extra_files=files)
inputs = torch.load(sys.argv[2])
torch.save(program(*inputs), sys.argv[3])
assert b"x0" in files["export.json"] and not any(name.startswith("embodrl") for name in sys.modules)
"""


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.load` is deprecated")
def test_torchscript_gives_the_deterministic_actions_in_a_process_without_embodrl(tmp_path):
    policies = {family: checkpoint(family, tmp_path / family) for family in FAMILIES}
    for family, policy in policies.items():
        convert("export-torchscript", tmp_path / family, tmp_path / f"{family}-ts")
        actions, inputs = reference(policy, observation())
        loaded = torch.jit.load(str(tmp_path / f"{family}-ts" / "policy.pt"))
        assert loaded(*inputs).shape == (N, C, A)
        torch.testing.assert_close(loaded(*inputs), actions, atol=1e-5, rtol=0)
        metadata = json.loads((tmp_path / f"{family}-ts" / "export.json").read_text())
        names = [spec["name"] for spec in metadata["inputs"]]
        assert names == [*OBS_KEYS, *(["x0"] if family == "flow" else [])]
    # only torch in the subprocess: the flow program (the one with x0) runs and matches there too
    torch.save(inputs, tmp_path / "inputs.pt")
    subprocess.run(
        [
            sys.executable,
            "-c",
            STANDALONE,
            *(str(tmp_path / f) for f in ("flow-ts/policy.pt", "inputs.pt", "out.pt")),
        ],
        check=True,
        cwd=tmp_path,
    )
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), actions, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_onnx_gives_the_deterministic_actions(tmp_path, family):
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    policy = checkpoint(family, tmp_path / "ckpt")
    convert("export-onnx", tmp_path / "ckpt", tmp_path / "onnx")
    actions, inputs = reference(policy, observation())
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "policy.onnx"))
    names = [spec["name"] for spec in json.loads((tmp_path / "onnx" / "export.json").read_text())["inputs"]]
    assert [i.name for i in session.get_inputs()] == names
    (out,) = session.run(None, {name: x.numpy() for name, x in zip(names, inputs, strict=True)})
    torch.testing.assert_close(torch.from_numpy(out), actions, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "family, overrides",
    [("autoregressive", {}), ("diffusion", {}), ("flow", {"flow": {"conditioning": "vla", "num_steps": 2}})],
)
def test_vla_families_are_refused_with_the_exportable_ones_named(tmp_path, family, overrides):
    policy = vla_testing.build(family, **overrides)
    with pytest.raises(UserError, match=r"exportable families: gaussian, flow \(flow.conditioning=mlp\)"):
        export_policy(policy, tmp_path / "out", "torchscript")
    assert not (tmp_path / "out").exists()


def test_unknown_format_is_refused(tmp_path):
    policy = checkpoint("gaussian", tmp_path / "ckpt")
    with pytest.raises(UserError, match="torchscript, onnx"):
        export_policy(policy, tmp_path / "out", "tflite")
