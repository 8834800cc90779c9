"""Chunk execution modes: open-loop N-of-H, overlap blending, real-time chunking splices."""

import numpy as np
import pytest

from embodrl.deploy.chunking import ChunkExecutor
from embodrl.deploy.config import ChunkConfig
from embodrl.errors import ConfigError, UserError


def _chunk(value: float, horizon: int, ramp: bool = False) -> np.ndarray:
    return (value + (np.arange(horizon) if ramp else np.zeros(horizon)))[:, None].astype(np.float32)  # [H, 1]


def _run(
    executor: ChunkExecutor, chunks: dict[int, tuple[int, np.ndarray]], steps: int
) -> list[float | None]:
    """Pop `steps` actions; chunks[t] = (obs_step, chunk) is added at step t. Returns the actions."""
    out = []
    for t in range(steps):
        if t in chunks:
            executor.add_chunk(chunks[t][1], obs_step=chunks[t][0])
        action = executor.pop_action()
        out.append(None if action is None else float(action[0]))
    return out


def test_open_loop_executes_n_of_h_then_requeries():
    ex = ChunkExecutor(ChunkConfig(mode="open_loop", action_horizon=4, execute_steps=2))
    queries = []
    for t in range(6):
        if ex.wants_chunk():
            queries.append(t)
            ex.add_chunk(_chunk(10 * t, 4, ramp=True), obs_step=t)
        ex.pop_action()
    assert queries == [0, 2, 4]


def test_open_loop_drops_stale_actions_of_a_late_chunk():
    ex = ChunkExecutor(ChunkConfig(mode="open_loop", action_horizon=4, execute_steps=3))
    actions = _run(ex, {2: (0, _chunk(0, 4, ramp=True))}, steps=4)
    assert actions == [None, None, 2.0, None]  # steps 0-1 had nothing; step 2 gets chunk[2]; N=3 ends it


def test_blend_weights_the_overlap():
    ex = ChunkExecutor(ChunkConfig(mode="blend", action_horizon=4, execute_steps=2, blend_new_weight=0.7))
    ex.add_chunk(_chunk(0, 4, ramp=True), obs_step=0)  # 0 1 2 3
    assert [float(ex.pop_action()[0]) for _ in range(2)] == [0.0, 1.0]
    assert ex.wants_chunk()
    ex.add_chunk(_chunk(10, 4), obs_step=2)  # 10 10 10 10 for steps 2..5
    rest = [float(ex.pop_action()[0]) for _ in range(4)]
    np.testing.assert_allclose(rest, [0.7 * 10 + 0.3 * 2, 0.7 * 10 + 0.3 * 3, 10, 10])


def test_rtc_starts_early_and_splices_continuously():
    cfg = ChunkConfig(mode="rtc", action_horizon=6, execute_steps=4, inference_delay_steps=1)
    ex = ChunkExecutor(cfg)
    ex.add_chunk(_chunk(0, 6), obs_step=0)
    actions = []
    for t in range(8):
        if t == 4:  # the query started at step 3 (see below) lands one step later
            ex.add_chunk(_chunk(1, 6), obs_step=3)
        if t == 3:
            assert ex.wants_chunk()  # N - delay = 3 steps in
        actions.append(float(ex.pop_action()[0]))
    np.testing.assert_allclose(actions, [0, 0, 0, 0, 1 / 3, 2 / 3, 1, 1])
    assert max(np.abs(np.diff(actions))) < 0.34  # open-loop replacement would jump by 1


def test_horizon_mismatch_is_refused():
    ex = ChunkExecutor(ChunkConfig(action_horizon=4, execute_steps=4))
    with pytest.raises(UserError, match="must match"):
        ex.add_chunk(np.zeros((8, 7)), obs_step=0)
    with pytest.raises(ConfigError, match="exceeds"):
        ChunkConfig(action_horizon=4, execute_steps=5)


def test_guided_rtc_requests_carry_the_plan_left_and_the_new_chunk_replaces_it():
    cfg = ChunkConfig(mode="guided_rtc", action_horizon=6, execute_steps=4, inference_delay_steps=2)
    ex = ChunkExecutor(cfg)
    assert ex.request_fields() == {}  # nothing planned yet: an unguided first chunk
    ex.add_chunk(_chunk(0, 6, ramp=True), obs_step=0)  # 0 1 2 3 4 5
    asked = []
    for t in range(3):
        if ex.wants_chunk():
            asked.append(t)
            fields = ex.request_fields()
        ex.pop_action()
    assert asked == [2]  # N - d = 2 steps in, as rtc
    np.testing.assert_array_equal(fields["prev_actions"][:, 0], [2, 3, 4, 5])  # steps 2.. of the plan
    assert fields["prev_actions"].dtype == np.float32 and fields["inference_delay"] == 2
    ex.add_chunk(_chunk(10, 6, ramp=True), obs_step=2)  # arrives one step late: its first action is stale
    assert [float(ex.pop_action()[0]) for _ in range(5)] == [11, 12, 13, 14, 15]  # replaced, not blended


def test_guided_rtc_delay_never_exceeds_the_plan_and_other_modes_send_nothing():
    ex = ChunkExecutor(
        ChunkConfig(mode="guided_rtc", action_horizon=4, execute_steps=4, inference_delay_steps=3)
    )
    ex.add_chunk(_chunk(0, 4), obs_step=0)
    for _ in range(3):
        ex.pop_action()
    assert ex.request_fields()["inference_delay"] == 1  # one action left to execute during inference
    for mode in ("open_loop", "blend", "rtc"):
        other = ChunkExecutor(ChunkConfig(mode=mode, action_horizon=4, execute_steps=2))
        other.add_chunk(_chunk(0, 4), obs_step=0)
        assert other.request_fields() == {}
    with pytest.raises(ConfigError, match="guided_rtc"):
        ChunkConfig(mode="guided_rtc", action_horizon=4, execute_steps=2, inference_delay_steps=2)
