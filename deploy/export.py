"""Export a policy's deterministic action path to TorchScript or ONNX, runnable without embodrl.

Exportable families: `gaussian` (the mean chunk) and `flow` with `flow.conditioning=mlp` (K Euler steps
of the velocity MLP, the plain ODE that `act(deterministic=True)` runs). Refused: `autoregressive` and
`diffusion` (token decoding and text prompts over the VLA backbone) and `flow` with `conditioning=vla`
(pi0's expert over a VLA prefix cache); serve those with `embodrl serve` instead.

The exported program takes plain tensors, the policy's `obs_keys` in order: `state` [N, S] and
`privileged` [N, P] float32, `rgb` / `wrist_rgb` uint8 [N, H, W, 3], `task_id` int64 [N]; flow
programs then take `x0` [N, C, A] float32, the noise at t = 1 (`act` draws it from N(0, I); zeros
give a chunk that depends on nothing but the observation). The output is `actions` [N, C, A] float32
in env units: normalization is inside. `export.json` next to the file lists inputs and outputs; a
TorchScript file also carries it (`torch.jit.load(path, _extra_files={"export.json": ""})`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodrl.errors import UserError
from embodrl.obs_keys import key_dtype
from embodrl.policies.base import Policy
from embodrl.policies.flow.sampling import euler_sample

FORMATS = {"torchscript": "policy.pt", "onnx": "policy.onnx"}  # format -> file name in the output folder
METADATA_FILE = "export.json"
EXPORTABLE = "gaussian, flow (flow.conditioning=mlp)"
EXAMPLE_BATCH = 2  # traced with 2 rows; the batch dimension stays dynamic


class ActionProgram(nn.Module):
    """Observation tensors (then x0 for flow) -> actions [N, C, A] in env units: what the export runs.

    Holds only the actor's modules (encoder, actor or velocity net, normalizers), not the critic.
    """

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        check_exportable(policy)
        cfg = policy.cfg
        self.family, self.obs_keys, self.chunk_shape = policy.family, cfg.obs_keys, policy.chunk_shape
        self.encoder, self.normalizers = policy.encoder, policy.normalizers
        self.actor = policy.actor if self.family == "gaussian" else policy.velocity_net
        self.num_steps = cfg.flow.num_steps

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        features = self.encoder.encode(dict(zip(self.obs_keys, inputs, strict=False)))  # [N, F]
        if self.family == "gaussian":
            action_norm = self.actor(features).view(-1, *self.chunk_shape)  # the Gaussian's mean
        else:
            x0 = inputs[-1]  # [N, C, A]
            action_norm = euler_sample(lambda x, t: self.actor(features, x, t), x0, self.num_steps)
        return self.normalizers["action"].unnormalize(action_norm)  # [N, C, A]


def check_exportable(policy: Policy) -> None:
    """Raise a UserError unless the policy's deterministic path is a fixed tensor program."""
    family = policy.family
    conditioning = policy.cfg.flow.conditioning
    if family == "gaussian" or (family == "flow" and conditioning == "mlp"):
        return
    what = f"flow with flow.conditioning={conditioning}" if family == "flow" else family
    raise UserError(
        f"a {what} policy cannot be exported (it decodes over a VLA backbone with text prompts); "
        f"exportable families: {EXPORTABLE}. Serve it with `embodrl serve CHECKPOINT` instead"
    )


def input_specs(policy: Policy) -> list[dict[str, Any]]:
    """Name, per-sample shape and dtype of each program input, in call order."""
    specs = []
    for key in policy.cfg.obs_keys:
        specs.append({"name": key, "shape": list(policy.obs_shapes[key]), "dtype": key_dtype(key)})
    if policy.family == "flow":
        specs.append({"name": "x0", "shape": list(policy.chunk_shape), "dtype": "float32"})
    return specs


def example_inputs(specs: list[dict[str, Any]], batch: int = EXAMPLE_BATCH) -> tuple[torch.Tensor, ...]:
    """Valid random inputs for `specs` (task ids 0, images and vectors random)."""
    g = torch.Generator().manual_seed(0)
    tensors = []
    for spec in specs:
        shape = (batch, *spec["shape"])
        if spec["dtype"] == "uint8":
            tensors.append(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))
        elif spec["dtype"] == "int64":
            tensors.append(torch.zeros(shape, dtype=torch.int64))
        else:
            tensors.append(torch.randn(shape, generator=g))
    return tuple(tensors)


def export_policy(policy: Policy, output: str | Path, fmt: str, device: str = "cpu") -> Path:
    """Write the policy's action program as `fmt` ("torchscript" | "onnx") plus export.json into `output`.

    The policy is moved to `device` and traced there. A TorchScript program runs on that device (the
    flow time grid is a traced constant); an ONNX file runs on any onnxruntime execution provider.
    """
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    program = ActionProgram(policy.to(device).eval()).eval()
    specs = input_specs(policy)
    metadata = {
        "family": policy.family,
        "format": fmt,
        "file": FORMATS[fmt],
        "device": device,
        "inputs": [{**spec, "shape": ["N", *spec["shape"]]} for spec in specs],
        "outputs": [{"name": "actions", "shape": ["N", *policy.chunk_shape], "dtype": "float32"}],
    }
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    path = output / FORMATS[fmt]
    inputs = tuple(x.to(device) for x in example_inputs(specs))
    text = json.dumps(metadata, indent=2)
    with torch.no_grad():
        if fmt == "torchscript":
            _save_torchscript(program, inputs, path, text)
        else:
            _save_onnx(program, inputs, path, [spec["name"] for spec in specs])
    (output / METADATA_FILE).write_text(text)
    return path


def _save_torchscript(
    program: ActionProgram, inputs: tuple[torch.Tensor, ...], path: Path, text: str
) -> None:
    # torch.jit is deprecated upstream but still the format C++ (libtorch) loads; the program has no
    # data-dependent Python branches, so tracing records it exactly.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
        traced = torch.jit.trace(program, inputs)
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: text})


def _save_onnx(
    program: ActionProgram, inputs: tuple[torch.Tensor, ...], path: Path, names: list[str]
) -> None:
    try:
        import onnxscript  # noqa: F401  (the dynamo ONNX exporter needs it)
    except ImportError:
        raise UserError(
            "ONNX export needs the onnx and onnxscript packages: pip install onnx onnxscript"
        ) from None
    batch = torch.export.Dim("batch")  # every input and the output share it
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="# The axis name: batch will not be used")  # it is used
        torch.onnx.export(
            program,
            inputs,
            str(path),
            dynamo=True,
            input_names=names,
            output_names=["actions"],
            dynamic_shapes=(tuple({0: batch} for _ in inputs),),  # one entry: the *inputs group
            external_data=False,  # one self-contained file (protobuf's 2 GB cap is far above these nets)
            verbose=False,
        )
