"""The learner's durable record of what it acknowledged: segment files of checksummed records, fsync'd.

A record is appended and synced before its batch is acknowledged, so a kill -9 loses no acknowledged
transition. A checkpoint holds everything before some segment: the learner starts a new segment when
it saves (`rotate`), records the number in the checkpoint, and drops the older segments once the
checkpoint is written (`forget_before`); a restart replays the segments from that number on. A record
torn by a kill (it was never acknowledged) is cut off when the log is opened.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

HEADER = struct.Struct("<II")  # payload length, crc32 of the payload
SUFFIX = ".log"


def _segment_number(path: Path) -> int:
    return int(path.stem)


def _sync_directory(directory: Path) -> None:
    """Make a new file's name durable (its data is synced separately)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TransitionLog:
    """Append-only records in `directory`/<segment>.log, from segment `first_segment` on."""

    def __init__(self, directory: str | Path, first_segment: int = 0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.forget_before(first_segment)  # a checkpoint written before a kill already holds them
        existing = self._segments()
        self.segment = _segment_number(existing[-1]) if existing else first_segment
        self._file = None

    def _segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"), key=_segment_number)

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:08d}{SUFFIX}"

    def records(self) -> Iterator[bytes]:
        """Every whole record, oldest first; a torn tail is cut off. Call before the first `append`."""
        for path in self._segments():
            data = path.read_bytes()
            offset = 0
            while offset + HEADER.size <= len(data):
                length, checksum = HEADER.unpack_from(data, offset)
                payload = data[offset + HEADER.size : offset + HEADER.size + length]
                if len(payload) != length or zlib.crc32(payload) != checksum:
                    break
                yield payload
                offset += HEADER.size + length
            if offset != len(data):
                with path.open("r+b") as file:
                    file.truncate(offset)

    def append(self, record: bytes) -> None:
        """Write one record and sync it to disk."""
        if self._file is None:
            path = self._path(self.segment)
            created = not path.exists()
            self._file = path.open("ab")
            if created:
                _sync_directory(self.directory)
        self._file.write(HEADER.pack(len(record), zlib.crc32(record)) + record)
        self._file.flush()
        os.fsync(self._file.fileno())

    def rotate(self) -> int:
        """Start a new segment; returns its number (what a checkpoint taken now holds everything before)."""
        self.close()
        self.segment += 1
        return self.segment

    def forget_before(self, segment: int) -> None:
        """Delete the segments before `segment` (a written checkpoint holds their records)."""
        for path in self._segments():
            if _segment_number(path) < segment:
                path.unlink()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
