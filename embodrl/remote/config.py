"""Settings of the learner's server and of an actor's connection (torch-free: the robot side reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.choices import check_positive
from embodrl.deploy.config import api_key_or_environment
from embodrl.errors import ConfigError

DEFAULT_PORT = 8765


def _check_key(api_key: str | None) -> str | None:
    if api_key == "":
        raise ConfigError("the API key is empty; leave it unset or give a non-empty key")
    return api_key_or_environment(api_key)


@dataclass
class LearnerServerConfig:
    """Where the learner listens and how much it buffers before actors wait for their acknowledgements."""

    host: str = "127.0.0.1"  # "0.0.0.0" to accept actors on other machines
    port: int = DEFAULT_PORT  # 0 picks a free port
    api_key: str | None = None  # unset: the EMBODRL_API_KEY variable; actors send `Authorization: Api-Key`
    max_pending_batches: int = 64  # stored but not yet in the replay buffer; beyond it acks wait
    max_message_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port={self.port} must be in [0, 65535]")
        check_positive("--max-pending", self.max_pending_batches)  # what `embodrl learner` calls it
        check_positive("max_message_bytes", self.max_message_bytes)
        self.api_key = _check_key(self.api_key)


@dataclass
class ActorConnectionConfig:
    """How an actor talks to its learner."""

    learner: str = f"ws://127.0.0.1:{DEFAULT_PORT}"
    actor_id: str = "actor-0"  # the learner drops resent batches by (actor id, sequence number)
    api_key: str | None = None  # unset: the EMBODRL_API_KEY variable
    max_unacked_batches: int = 1024  # the outbox of batches the learner has not acknowledged
    # a full outbox: wait for room (a simulator pauses), or drop its oldest batch (a robot cannot pause)
    drop_when_full: bool = False
    pull_every_s: float = 1.0  # how often to ask for newer weights
    wait_s: float = 30.0  # how long the first connection may take (the learner starting)
    reconnect_s: float = 0.5  # first backoff after a lost connection, doubling up to max_reconnect_s
    max_reconnect_s: float = 5.0
    timeout_s: float = 30.0  # a reply not received by then drops the connection
    max_message_bytes: int = 256 * 2**20  # weights of large policies

    def __post_init__(self) -> None:
        for key in ("max_unacked_batches", "pull_every_s", "reconnect_s", "max_reconnect_s", "timeout_s"):
            check_positive(key, getattr(self, key))
        check_positive("--wait", self.wait_s, allow_zero=True)  # what `embodrl actor` calls it
        if not self.learner.startswith(("ws://", "wss://")):
            self.learner = f"ws://{self.learner}"
        self.api_key = _check_key(self.api_key)
