"""`embodrl reward train`: fit a success classifier (or a progress model) on labelled LeRobot datasets, its
held-out episodes scored; `embodrl reward eval`: score a trained classifier on other labelled datasets.

Labels are LeRobot's HIL-SERL per-frame `next.reward` (> 0.5: the frame shows the task done). Episodes,
not frames, are split (seeded; episodes with and without a success are split separately, so both sides
hold each), because neighbouring frames of one episode are near copies. The frozen tower's features are
computed once per frame; the head then trains for `epochs` passes with AdamW and binary cross-entropy.
A progress model learns, on the episodes with a success, each frame's progress t / t_success (1 from the
first success on), so that the difference of two frames' outputs is the progress between them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from embodrl.data.dataset_inputs import DatasetInputs, dataset_inputs
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import REWARD_KEY
from embodrl.errors import UserError
from embodrl.obs_keys import STATE
from embodrl.rewards.classifier import KIND, PROGRESS_KIND, ClassifierSpec, SuccessClassifier, load_classifier
from embodrl.rewards.config import RewardTrainConfig
from embodrl.rewards.metrics import classification_metrics, progress_metrics, threshold_curve

METRICS_FILE = "metrics.json"


def split_episodes(has_success: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) episode indices: `held_out` of the episodes with a success and of those without,
    at least one of each kind held out and one kept where there are two or more."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for group in (np.flatnonzero(has_success), np.flatnonzero(~has_success)):
        group = rng.permutation(group)
        n = min(max(round(held_out * len(group)), 1), len(group) - 1) if len(group) > 1 else 0
        test += group[:n].tolist()
        train += group[n:].tolist()
    return np.sort(train), np.sort(test)


def frame_labels(dataset: LeRobotDataset) -> np.ndarray:
    """bool [F]: which frames show the task done."""
    if REWARD_KEY not in dataset.features:
        raise UserError(
            f"{dataset.root} has no per-frame success labels ({REWARD_KEY}); record them with `embodrl "
            "collect --post-success-steps K --keep-failures` or the deploy recorder's success key"
        )
    return dataset.column(REWARD_KEY).reshape(-1) > 0.5


def progress_targets(labels: np.ndarray, episode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(progress [F] in [0, 1], known [F]): t / t_success up to an episode's first success, 1 from it on;
    unknown in episodes without a success."""
    progress, known = np.zeros(len(labels), np.float32), np.zeros(len(labels), bool)
    for e in np.unique(episode):
        frames = np.flatnonzero(episode == e)
        hits = np.flatnonzero(labels[frames])
        if hits.size:
            first = max(int(hits[0]), 1)
            progress[frames] = np.minimum(np.arange(len(frames)) / first, 1.0)
            known[frames] = True
    return progress, known


def cache_features(
    model: SuccessClassifier, dataset: LeRobotDataset, cameras: dict[str, str], batch: int = 256
) -> dict[str, torch.Tensor]:
    """{obs key: tower features [F, C, h, w]} of every frame, episode by episode (decoded once)."""
    out: dict[str, list[torch.Tensor]] = {k: [] for k in cameras}
    for e in range(dataset.num_episodes):
        for key, name in cameras.items():
            frames = torch.from_numpy(dataset.camera_frames(name, e))
            out[key] += [model.features(frames[i : i + batch]).cpu() for i in range(0, len(frames), batch)]
    return {k: torch.cat(v) for k, v in out.items()}


@dataclass
class LabelledFrames:
    """Every frame of one or more datasets, as the head reads them: tower features, state, labels, and the
    episode each frame belongs to, numbered across the datasets in order."""

    features: dict[str, torch.Tensor]  # obs key -> [F, C, h, w]
    state: torch.Tensor | None  # [F, S]
    labels: np.ndarray  # bool [F]: the frame shows the task done
    episode: np.ndarray  # [F]
    source: list[tuple[str, int]]  # per episode: (dataset folder, its episode index there)


def read_datasets(
    datasets: list[LeRobotDataset],
    labels: list[np.ndarray],
    model: SuccessClassifier,
    key_map: dict[str, str],
    inputs: DatasetInputs,
) -> LabelledFrames:
    """LabelledFrames of `datasets` and their frame labels (each checked to hold the first's observation
    shapes)."""
    features: dict[str, list[torch.Tensor]] = {k: [] for k in model.spec.cameras}
    state, episode, source = [], [], []
    for dataset in datasets:
        these = dataset_inputs(dataset, model.spec.obs_keys, key_map)
        if these.shapes != inputs.shapes:
            raise UserError(
                f"{dataset.root} holds observations of shapes {these.shapes}, {datasets[0].root} of "
                f"{inputs.shapes}; a classifier trains on one kind"
            )
        episode.append(dataset.episode_of(np.arange(dataset.num_frames)) + len(source))
        source += [(str(dataset.root), e) for e in range(dataset.num_episodes)]
        for key, frames in cache_features(model, dataset, {k: these.features[k] for k in features}).items():
            features[key].append(frames)
        if STATE in model.spec.obs_keys:
            state.append(torch.from_numpy(dataset.column(these.features[STATE]).astype(np.float32)))
    return LabelledFrames(
        features={k: torch.cat(v) for k, v in features.items()},
        state=torch.cat(state) if state else None,
        labels=np.concatenate(labels),
        episode=np.concatenate(episode),
        source=source,
    )


def train_reward_model(dataset_paths: str | Path | list, cfg: RewardTrainConfig) -> tuple[Path, dict]:
    """Train on one or more labelled datasets (e.g. demos and a policy's own episodes), score the held-out
    episodes (drawn from all of them; scored per dataset too), write the checkpoint folder and its
    metrics.json; returns both."""
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    paths = [dataset_paths] if isinstance(dataset_paths, str | Path) else list(dataset_paths)
    datasets = [LeRobotDataset(path) for path in paths]
    labels_per_dataset = [frame_labels(dataset) for dataset in datasets]
    inputs = dataset_inputs(datasets[0], cfg.obs_keys, cfg.key_map)
    spec = ClassifierSpec(
        obs_keys=tuple(cfg.obs_keys),
        shapes=inputs.shapes,
        tower=cfg.tower,
        blocks=cfg.blocks,
        channels=cfg.channels,
        hidden=cfg.hidden,
        threshold=cfg.decision_threshold,
        kind=KIND if cfg.model == "classifier" else PROGRESS_KIND,
    )
    model = SuccessClassifier(spec, cfg.device)
    data = read_datasets(datasets, labels_per_dataset, model, cfg.key_map, inputs)
    labels, episode = data.labels, data.episode
    names = " + ".join(str(d.root) for d in datasets)
    has_success = np.asarray([labels[episode == e].any() for e in range(len(data.source))])
    if not has_success.any() or has_success.all() and labels.all():
        raise UserError(f"{names} needs frames labelled success and frames that are not")
    train_eps, test_eps = split_episodes(has_success, cfg.held_out, cfg.seed)
    if len(test_eps) == 0 or len(train_eps) == 0:
        raise UserError(f"{names} has {len(data.source)} episodes; a held-out split needs >= 2")
    target, known = labels.astype(np.float32), np.ones(len(labels), bool)
    if cfg.model == "progress":
        target, known = progress_targets(labels, episode)
    train = torch.from_numpy(np.flatnonzero(np.isin(episode, train_eps) & known))
    head = model.head
    if data.state is not None:
        head.state_mean.copy_(data.state[train].mean(0))
        head.state_std.copy_(data.state[train].std(0).clamp_min(1e-3))
    fit(head, data.features, data.state, torch.from_numpy(target), train, cfg)
    probability = predict(head, data.features, data.state, cfg.device).numpy()

    def scores(frames: np.ndarray) -> dict:
        return classification_metrics(probability[frames], labels[frames], spec.threshold, episode[frames])

    test = np.flatnonzero(np.isin(episode, test_eps))
    metrics = {
        "dataset": names,
        "episodes": {"train": len(train_eps), "held_out": len(test_eps)},
        "held_out_episodes": [data.source[e][1] for e in test_eps]
        if len(datasets) == 1
        else [list(data.source[e]) for e in test_eps],
        "held_out": scores(test),
        "held_out_progress": progress_metrics(probability[test], labels[test], episode[test]),
        "train": scores(np.flatnonzero(np.isin(episode, train_eps))),  # scored on every frame
        "held_out_curve": threshold_curve(probability[test], labels[test]),
        "config": asdict(cfg),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if len(datasets) > 1:  # e.g. the false alarms left on a policy's own episodes
        metrics["held_out_by_dataset"] = {
            name: scores(test[part]) for name, part in _by_dataset(datasets, episode[test]).items()
        }
    out = (
        Path(cfg.out)
        if cfg.out
        else Path("runs/reward") / f"{datasets[0].root.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    model.save(out, {"dataset": names, "held_out": metrics["held_out"]})
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2))
    return out, metrics


def _by_dataset(datasets: list[LeRobotDataset], episode: np.ndarray) -> dict[str, np.ndarray]:
    """{dataset folder: which of the frames (by their episode numbers across the datasets) are its}."""
    first = np.cumsum([0] + [d.num_episodes for d in datasets])
    return {
        str(d.root): (episode >= lo) & (episode < hi)
        for d, lo, hi in zip(datasets, first[:-1], first[1:], strict=True)
    }


def score_reward_model(
    checkpoint: str | Path, dataset_paths: list, key_map: dict[str, str] | None = None, device: str = "cpu"
) -> dict[str, dict]:
    """A trained classifier's scores on every frame of each labelled dataset, e.g. a policy's own episodes
    before they join its training set: {dataset folder: classification metrics at its threshold}."""
    model = load_classifier(checkpoint, device)
    datasets = [LeRobotDataset(path) for path in dataset_paths]
    labels = [frame_labels(dataset) for dataset in datasets]
    inputs = dataset_inputs(datasets[0], model.spec.obs_keys, key_map)
    data = read_datasets(datasets, labels, model, dict(key_map or {}), inputs)
    probability = predict(model.head, data.features, data.state, device).numpy()
    return {
        name: classification_metrics(
            probability[part], data.labels[part], model.spec.threshold, data.episode[part]
        )
        for name, part in _by_dataset(datasets, data.episode).items()
    }


def _head_inputs(features, state, index):
    return {k: v[index] for k, v in features.items()}, None if state is None else state[index]


def fit(
    head: nn.Module,
    features: dict[str, torch.Tensor],
    state: torch.Tensor | None,
    target: torch.Tensor,
    train: torch.Tensor,
    cfg: RewardTrainConfig,
) -> None:
    """AdamW on binary cross-entropy (soft targets for progress) over shuffled minibatches of `train`."""
    device = torch.device(cfg.device)
    head.train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    labels = target[train]
    # successes are a few frames per episode: weighted up to the failures' total unless cfg.balance is off
    pos_weight = torch.tensor(1.0)
    if cfg.balance and cfg.model == "classifier":
        pos_weight = (len(labels) - labels.sum()) / labels.sum().clamp_min(1)
    for _ in range(cfg.epochs):
        order = train[torch.randperm(len(train), generator=generator)]
        for i in range(0, len(order), cfg.batch_size):
            batch = order[i : i + cfg.batch_size]
            feats, s = _head_inputs(features, state, batch)
            logits = head({k: v.to(device) for k, v in feats.items()}, None if s is None else s.to(device))
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, target[batch].to(device), pos_weight=pos_weight.to(device)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    head.eval()


@torch.no_grad()
def predict(
    head: nn.Module,
    features: dict[str, torch.Tensor],
    state: torch.Tensor | None,
    device: str,
    batch: int = 1024,
) -> torch.Tensor:
    """P(success) of every cached frame [F]."""
    n = len(next(iter(features.values())))
    out = []
    for i in range(0, n, batch):
        index = torch.arange(i, min(i + batch, n))
        feats, s = _head_inputs(features, state, index)
        logits = head({k: v.to(device) for k, v in feats.items()}, None if s is None else s.to(device))
        out.append(torch.sigmoid(logits).cpu())
    return torch.cat(out)
