"""Export a policy's deterministic action path to TorchScript or ONNX, runnable without embodrl.

The policy gives the program (`Policy.action_program`): today the gaussian family (the mean chunk) and
flow with `flow.conditioning=mlp` (K Euler steps of the velocity MLP, the plain ODE that
`act(deterministic=True)` runs). The others decode over a VLA backbone with text prompts and refuse;
serve those with `embodrl serve` instead.

The exported program takes plain tensors, the policy's `obs_keys` in order: `state` [N, S] and
`privileged` [N, P] float32, `rgb` / `wrist_rgb` uint8 [N, H, W, 3], `task_id` int64 [N]; then the
program's extra inputs (flow: `x0` [N, C, A] float32, the noise at t = 1; `act` draws it from N(0, I),
zeros give a chunk that depends on nothing but the observation). The output is `actions` [N, C, A]
float32 in env units: normalization is inside. `export.json` next to the file lists inputs and outputs; a
TorchScript file also carries it (`torch.jit.load(path, _extra_files={"export.json": ""})`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from embodrl.errors import UserError
from embodrl.obs_keys import key_dtype
from embodrl.policies.base import ActionProgram, Policy

FORMATS = {"torchscript": "policy.pt", "onnx": "policy.onnx"}  # format -> file name in the output folder
METADATA_FILE = "export.json"
EXAMPLE_BATCH = 2  # traced with 2 rows; the batch dimension stays dynamic


def input_specs(policy: Policy, program: ActionProgram) -> list[dict[str, Any]]:
    """Name, per-sample shape and dtype of each program input, in call order: the observation keys, then
    the program's extra inputs."""
    specs = [
        {"name": key, "shape": list(policy.obs_shapes[key]), "dtype": key_dtype(key)}
        for key in policy.cfg.obs_keys
    ]
    return specs + [{"name": x.name, "shape": list(x.shape), "dtype": x.dtype} for x in program.extra_inputs]


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
    if policy.cfg.steers:
        raise UserError(
            f"this policy picks the initial noise of {policy.cfg.steers} (noise-space RL), which export does "
            "not decode yet; export that policy, or evaluate this one with `embodrl eval`"
        )
    program = policy.to(device).eval().action_program().eval()  # a UserError when not exportable
    specs = input_specs(policy, program)
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
