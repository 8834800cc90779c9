"""pi0 / pi0.5 parity against LeRobot 0.4.4's own PyTorch implementation: same weights, inputs and noise,
same actions.

Two parts, each in its own environment (LeRobot pins a Python, torch and a patched transformers that
embodrl's environment does not hold):

  1. `lerobot` (an environment with `lerobot==0.4.4` and the transformers its pi0 asks for: 4.53.2 with
     openpi's `transformers_replace` changes, LeRobot's `fix/lerobot_openpi` branch). Builds LeRobot's
     PI0Policy / PI05Policy with random weights at a small size, saves it with LeRobot's save_pretrained and
     its pre/post-processors (the normalization stats), and writes reference.npz: the inputs (two 224x224
     cameras, a 6-D state, prompts), the noise [B, 50, 32] given to `sample_actions`, LeRobot's prompt
     tokens, and its actions.
  2. `embodrl` (embodrl's environment). Imports the folder with `embodrl convert pi0-import ... fmt=lerobot`,
     runs the imported flow policy's Euler sampler from the same noise and prints the largest absolute
     action difference (target: <= 1e-4 in float32).

    python scripts/pi0_parity.py lerobot --out /tmp/pi0_parity     # in the LeRobot environment
    python scripts/pi0_parity.py embodrl --out /tmp/pi0_parity     # in embodrl's environment

Size: LeRobot knows only the full Gemma variants (gemma_2b / gemma_300m) and a fixed SigLIP So400m tower.
Part 1 adds openpi's `dummy` Gemma (width 64, depth 4, 8 heads of 16, one KV head) to LeRobot's variant
table and, with `--vision tiny` (default), builds the SigLIP tower 144 wide with 2 layers (`--vision so400m`
keeps LeRobot's So400m/14 tower); the projector always maps to the Gemma width. Everything else, from the
processors to the attention masks and the Euler loop, is LeRobot's code. No tokenizer is downloaded: a small
byte-level BPE with PaliGemma's conventions (BOS first, right padding) stands in for PaliGemma's, and both
sides read the same tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

VARIANTS = ("pi0", "pi05")
BATCH, IMAGE, STATE_DIM, ACTION_DIM = 2, 224, 6, 6
HORIZON, MODEL_DIM = 50, 32  # LeRobot's chunk_size and max_action_dim
CAMERAS = ("observation.images.front", "observation.images.wrist")
# A prompt with an underscore and one with outer spaces: openpi cleans both, LeRobot's pi0 does not.
PROMPTS = ("pick up the red block", " push the blue_cube to the target ")
# openpi's gemma.get_config("dummy"): width, depth, mlp_dim, num_heads, num_kv_heads, head_dim
DUMMY_GEMMA = (64, 4, 128, 8, 1, 16)
TINY_SIGLIP = {"hidden_size": 144, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 288}
TOLERANCE = 1e-4


# ---- part 1: LeRobot ------------------------------------------------------------------------------------
def patch_lerobot_sizes(variant: str, vision: str) -> None:
    """Give LeRobot's modeling module openpi's `dummy` Gemma variant and, for `tiny`, a small SigLIP."""
    import importlib

    module = importlib.import_module(f"lerobot.policies.{variant}.modeling_{variant}")
    full_size = module.get_gemma_config

    def get_gemma_config(name: str):
        return module.GemmaConfig(*DUMMY_GEMMA) if name == "dummy" else full_size(name)

    paligemma = module.PaliGemmaForConditionalGeneration

    def build_paligemma(config):
        # LeRobot fixes the projector to 2048 (gemma_2b's width); match the language model instead.
        config.vision_config.projection_dim = config.text_config.hidden_size
        if vision == "tiny":
            for key, value in TINY_SIGLIP.items():
                setattr(config.vision_config, key, value)
        return paligemma(config=config)

    module.get_gemma_config = get_gemma_config
    module.PaliGemmaForConditionalGeneration = build_paligemma


def write_tokenizer(directory: Path) -> None:
    """A byte-level BPE over the prompts with PaliGemma's conventions: <bos> first, <pad> on the right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*PROMPTS, "Task: , State: ;\nAction: ", " ".join(str(i) for i in range(256))]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tokenizer.token_to_id("<bos>"))]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    wrapped.save_pretrained(str(directory))


def use_local_tokenizer(directory: Path) -> None:
    """LeRobot's pi0 processors name PaliGemma's hub tokenizer; load the local stand-in instead."""
    from lerobot.processor import tokenizer_processor
    from transformers import AutoTokenizer

    class LocalTokenizer:
        @staticmethod
        def from_pretrained(name: str, **kwargs):
            return AutoTokenizer.from_pretrained(str(directory), **kwargs)

    tokenizer_processor.AutoTokenizer = LocalTokenizer


def randomize(model, seed: int) -> None:
    """Every parameter random (LeRobot's init zeroes the adaRMS projections and sets norms to one, which
    would hide whole paths): matrices ~ N(0, 1/fan_in), SigLIP LayerNorm scales ~ 1 + N(0, 0.01),
    Gemma (1 + w) norm weights and biases ~ N(0, 0.01)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() >= 2:
                value = noise / (param[0].numel() ** 0.5)
            elif "vision_tower" in name and "norm" in name and name.endswith("weight"):
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            param.copy_(value.to(param.dtype))


def make_stats(seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Normalization stats of a 6-D state and action, in degree-like units."""
    rng = np.random.default_rng(seed)
    stats = {}
    for key in ("observation.state", "action"):
        mean, std = rng.uniform(-30, 30, STATE_DIM), rng.uniform(5, 20, STATE_DIM)
        stats[key] = {
            "mean": mean,
            "std": std,
            "min": mean - 3 * std,
            "max": mean + 3 * std,
            "q01": mean - 2.2 * std,
            "q99": mean + 2.4 * std,
        }
    return {k: {s: v.astype(np.float32) for s, v in st.items()} for k, st in stats.items()}


def make_inputs(seed: int) -> dict[str, np.ndarray]:
    """Two smooth random camera images per row (uint8 HWC), a state near the stats' range, the noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(len(CAMERAS), BATCH, 8, 8, 3)).astype(np.float64)
    images = np.kron(coarse, np.ones((1, 1, IMAGE // 8, IMAGE // 8, 1)))  # 28x28 blocks
    images = np.clip(images + rng.normal(scale=12, size=images.shape), 0, 255).astype(np.uint8)
    return {
        "images": images,  # [cameras, B, H, W, 3]
        "state": rng.uniform(-40, 40, size=(BATCH, STATE_DIM)).astype(np.float32),
        "noise": rng.standard_normal(size=(BATCH, HORIZON, MODEL_DIM)).astype(np.float32),
    }


def run_lerobot(out: Path, variant: str, vision: str, seed: int) -> None:
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(seed)
    patch_lerobot_sizes(variant, vision)
    folder = out / variant
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder / "tokenizer")
    use_local_tokenizer(folder / "tokenizer")
    if variant == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy
    features = {key: PolicyFeature(type=FeatureType.VISUAL, shape=(3, IMAGE, IMAGE)) for key in CAMERAS}
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    config = Config(
        dtype="float32",
        device="cpu",
        input_features=features,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
    )
    # LeRobot's config validation knows the full-size names only; the modeling table now has `dummy`.
    config.paligemma_variant = config.action_expert_variant = "dummy"
    policy = Policy(config)
    randomize(policy, seed)
    policy.eval()
    stats = make_stats(seed)
    torch_stats = {k: {s: torch.from_numpy(v) for s, v in st.items()} for k, st in stats.items()}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=torch_stats)

    inputs = make_inputs(seed)
    batch = {
        key: torch.from_numpy(inputs["images"][i]).permute(0, 3, 1, 2).float() / 255.0
        for i, key in enumerate(CAMERAS)
    }
    batch["observation.state"] = torch.from_numpy(inputs["state"])
    batch["task"] = list(PROMPTS)
    processed = preprocessor(batch)
    noise = torch.from_numpy(inputs["noise"])
    with torch.no_grad():
        normalized = policy.predict_action_chunk(processed, noise=noise)
        actions = postprocessor(normalized)

    checkpoint = folder / "lerobot_checkpoint"
    policy.save_pretrained(checkpoint)
    preprocessor.save_pretrained(checkpoint)
    postprocessor.save_pretrained(checkpoint)
    np.savez(
        folder / "reference.npz",
        **inputs,
        prompts=np.array(PROMPTS),
        tokens=processed["observation.language.tokens"].numpy(),
        token_mask=processed["observation.language.attention_mask"].numpy(),
        state_normalized=processed["observation.state"].numpy(),
        actions_normalized=normalized.numpy(),
        actions=actions.numpy(),
    )
    (folder / "lerobot_run.json").write_text(
        json.dumps({"variant": variant, "vision": vision, "seed": seed, "lerobot": lerobot_version()})
    )
    print(f"{variant}: wrote {checkpoint} and {folder / 'reference.npz'}; actions {tuple(actions.shape)}")


def lerobot_version() -> str:
    from importlib.metadata import version

    return version("lerobot")


# ---- part 2: embodrl ------------------------------------------------------------------------------------
def run_embodrl(out: Path, variant: str) -> float:
    import torch
    from tensordict import TensorDict

    from embodrl.obs_keys import IMAGE_KEYS, STATE
    from embodrl.policies.flow.sampling import euler_sample
    from embodrl.policies.flow.vla_flow import make_prompts
    from embodrl.policies.loading import load_policy
    from embodrl.policies.vla.tokenizer import tokenize_instructions

    folder = out / variant
    reference = np.load(folder / "reference.npz")
    imported = folder / "embodrl_checkpoint"
    command = [
        sys.executable,
        "-m",
        "embodrl.cli",
        "convert",
        "pi0-import",
        str(folder / "lerobot_checkpoint"),
        str(imported),
        "fmt=lerobot",
        f"tokenizer_dir={folder / 'tokenizer'}",
    ]
    if not imported.exists():
        print("$ embodrl " + " ".join(command[3:]))
        subprocess.run(command, check=True)
    policy = load_policy(imported).eval()

    images = reference["images"]
    obs = TensorDict(
        {key: torch.from_numpy(images[i]) for i, key in enumerate(IMAGE_KEYS)}
        | {STATE: torch.from_numpy(reference["state"])},
        batch_size=[BATCH],
    )
    obs["instruction"] = [str(p) for p in reference["prompts"]]
    with torch.no_grad():
        state = policy.normalizers["state"](obs[STATE])
        flow = policy.cfg.flow
        prompts = make_prompts(
            flow.vla_variant, obs["instruction"], state, flow.clean_instruction, flow.prompt_state_dim
        )
        backbone = policy.prefix_encoder.backbone
        tokens, mask = tokenize_instructions(
            backbone.tokenizer, prompts, backbone.max_instruction_tokens, "cpu"
        )
        _, velocity = policy.condition(obs)
        chain = euler_sample(velocity, torch.from_numpy(reference["noise"]), policy.cfg.flow.num_steps)
        normalized = chain[:, : policy.chunk_shape[0], : policy.chunk_shape[1]]
        actions = policy.normalizers["action"].unnormalize(normalized)

    same_tokens = tokens.shape == reference["tokens"].shape and bool(
        (tokens.numpy() == reference["tokens"]).all() and (mask.numpy() == reference["token_mask"]).all()
    )
    state_diff = np.abs(state.numpy() - reference["state_normalized"][:, : state.shape[1]]).max()
    normalized_diff = np.abs(normalized.numpy() - reference["actions_normalized"]).max()
    diff = float(np.abs(actions.numpy() - reference["actions"]).max())
    scale = float(np.abs(reference["actions"]).max())
    print(
        f"{variant}: prompt tokens {'identical' if same_tokens else 'DIFFER'}; normalized state max diff "
        f"{state_diff:.2e}; normalized actions max diff {normalized_diff:.2e}; actions max abs diff "
        f"{diff:.2e} (actions up to {scale:.1f}) -> {'OK' if diff <= TOLERANCE else 'ABOVE'} {TOLERANCE:g}"
    )
    if not same_tokens:
        print(f"  embodrl prompts: {prompts!r}")
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("lerobot", "embodrl"), help="which side to run (see the docstring)")
    parser.add_argument("--out", type=Path, required=True, help="folder shared by the two parts")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--vision", choices=("tiny", "so400m"), default="tiny", help="SigLIP size (part 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.part == "lerobot":
        for variant in args.variants:
            run_lerobot(args.out, variant, args.vision, args.seed)
        return
    diffs = [run_embodrl(args.out, variant) for variant in args.variants]
    sys.exit(0 if max(diffs) <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
