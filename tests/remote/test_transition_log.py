"""The learner's transition log and intake: records survive a reopen, a torn tail is cut, segments rotate,
duplicates are dropped by (actor, seq)."""

from __future__ import annotations

from embodrl.remote.intake import Arrival, Intake
from embodrl.remote.transition_log import TransitionLog


def test_records_survive_a_reopen_and_a_torn_tail_is_cut(tmp_path):
    log = TransitionLog(tmp_path)
    log.append(b"first")
    log.append(b"second")
    log.close()
    segment = next(tmp_path.glob("*.log"))
    with segment.open("ab") as file:  # a kill in the middle of the third record's write
        file.write(b"\x10\x00\x00\x00\x00")
    reopened = TransitionLog(tmp_path)
    assert list(reopened.records()) == [b"first", b"second"]
    reopened.append(b"third")  # lands after the cut, not after the garbage
    reopened.close()
    assert list(TransitionLog(tmp_path).records()) == [b"first", b"second", b"third"]


def test_a_checkpointed_segment_is_dropped_and_the_rest_replayed(tmp_path):
    log = TransitionLog(tmp_path)
    log.append(b"in the checkpoint")
    first = log.rotate()
    log.append(b"after it")
    log.close()
    # a kill after the checkpoint was written but before forget_before: reopening drops the old segment
    assert list(TransitionLog(tmp_path, first).records()) == [b"after it"]
    assert len(list(tmp_path.glob("*.log"))) == 1


def test_intake_drops_duplicates_and_rotates_with_what_is_queued(tmp_path):
    intake = Intake(TransitionLog(tmp_path), {"a": 1}, max_pending=4)
    arrival = Arrival({"reward": [0.0]}, env_steps=1)
    assert intake.store("a", 1, b"old", arrival)  # already held: a duplicate, not logged
    assert not intake.store("a", 2, b"new", arrival)
    assert not intake.store("b", 0, b"other actor", arrival)
    assert intake.store("a", 2, b"new again", arrival)
    queued, segment, last_seq = intake.rotate()
    assert len(queued) == 2 and last_seq == {"a": 2, "b": 0} and segment == 1
    assert intake.take() == []
    intake.close()
    assert list(TransitionLog(tmp_path).records()) == [b"new", b"other actor"]
