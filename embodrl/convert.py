"""`embodrl convert`: public checkpoint layouts <-> embodrl policy checkpoints, and LoRA merging.

Conversions (the CLI's first argument):
  openvla-import  an OpenVLA / OpenVLA-OFT folder (HF layout) -> an embodrl autoregressive checkpoint
  openvla-export  an embodrl autoregressive checkpoint -> the OpenVLA(-OFT) layout
  pi0-import      an openpi-PyTorch / LeRobot pi0 or pi0.5 folder -> an embodrl flow checkpoint
  pi0-export      an embodrl flow checkpoint -> the pi0 layout it came from
  merge-lora      a LoRA checkpoint (base weights + adapter files) -> a plain checkpoint, adapters merged
  export-torchscript  a gaussian or MLP-flow checkpoint -> policy.pt + export.json: its deterministic
                      actions as TorchScript, loadable without embodrl (deploy/export.py)
  export-onnx         the same as policy.onnx (needs the onnx and onnxscript packages)
Heavy backends are imported only for the conversion asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from embodrl.errors import UserError


def _openvla_import(source: Path, output: Path, **options: Any) -> None:
    from embodrl.policies.pretrained.openvla import import_openvla

    import_openvla(source, **options).save_pretrained(output)


def _openvla_export(source: Path, output: Path, **options: Any) -> None:
    from embodrl.policies.loading import load_policy
    from embodrl.policies.pretrained.openvla import export_openvla

    export_openvla(load_policy(source), output, **options)


def _pi0_import(source: Path, output: Path, **options: Any) -> None:
    from embodrl.policies.pretrained.pi0 import import_pi0

    import_pi0(source, **options).save_pretrained(output)


def _pi0_export(source: Path, output: Path, **options: Any) -> None:
    from embodrl.policies.loading import load_policy
    from embodrl.policies.pretrained.pi0 import export_pi0

    export_pi0(load_policy(source), output, **options)


def _merge_lora(source: Path, output: Path) -> None:
    from embodrl.policies.loading import load_lora_checkpoint
    from embodrl.policies.lora import merge_lora

    policy, _ = load_lora_checkpoint(source)
    merge_lora(policy).save_pretrained(output)


def _export(fmt: str, source: Path, output: Path, device: str = "cpu") -> None:
    from embodrl.deploy.export import export_policy
    from embodrl.policies.loading import load_policy

    export_policy(load_policy(source), output, fmt, device)


CONVERSIONS: dict[str, Callable[..., None]] = {
    "openvla-import": _openvla_import,
    "openvla-export": _openvla_export,
    "pi0-import": _pi0_import,
    "pi0-export": _pi0_export,
    "merge-lora": _merge_lora,
    "export-torchscript": partial(_export, "torchscript"),
    "export-onnx": partial(_export, "onnx"),
}


def convert(kind: str, source: str | Path, output: str | Path, **options: Any) -> Path:
    """Run conversion `kind` (a key of CONVERSIONS) from folder `source` into folder `output`.

    `options` go to the backend: openvla-import takes decoding ("sequential" | "oft"), chunk_size,
    action_dim, unnorm_key, max_prompt_tokens; openvla-export takes unnorm_key; pi0-import takes fmt
    ("openpi" | "lerobot"), tokenizer_dir, chunk_size, likelihood, num_steps, asset_id; pi0-export
    takes fmt; export-torchscript and export-onnx take device (where the program is traced and, for
    TorchScript, runs)."""
    if kind not in CONVERSIONS:
        raise UserError(f"unknown conversion {kind!r}; choose one of {', '.join(CONVERSIONS)}")
    source, output = Path(source), Path(output)
    if not source.is_dir():
        raise UserError(f"{source} is not a folder; pass the checkpoint folder to convert")
    if output.exists() and any(output.iterdir()):
        raise UserError(f"{output} exists and is not empty; choose a new output folder")
    try:
        CONVERSIONS[kind](source, output, **options)
    except TypeError as error:  # an option the backend does not take
        if "unexpected keyword argument" not in str(error):
            raise
        raise UserError(f"{kind}: {error}") from None
    return output
