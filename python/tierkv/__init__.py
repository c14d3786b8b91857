"""tierkv: a KV-cache block store for LLM inference, from Python.

A worker attaches to a tierkvd (``Client.open``) or runs a store in its own
process (``Client.open_embedded``), then drives the same calls as the C++
client (``tierkv/client.h``): ``lookup``, ``allocate``, ``commit``,
``poll_events`` / ``wait_events``, ``complete``, ``finish``. KV bytes never
pass through Python objects: copies run in C++ with the GIL released,
between the store's shared memory and the engine's own tensors
(``RegisteredDevice``), or in the engine itself (``copies="caller"`` and
``Client.host_block`` views).

Every failing call raises a subclass of :class:`Error` named after its
status code (``UnavailableError``, ``InvalidArgumentError``, ...).
"""

from __future__ import annotations

from tierkv._errors import (
    AbortedError,
    AlreadyExistsError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
    error_for,
)
from tierkv._native import (
    AllocateResult,
    Client,
    CommitResult,
    FinishedTransfer,
    KvLayout,
    LookupResult,
    RegisteredDevice,
    TransferEvent,
)

__all__ = [
    "AbortedError",
    "AllocateResult",
    "AlreadyExistsError",
    "Client",
    "CommitResult",
    "DataLossError",
    "DeadlineExceededError",
    "Error",
    "FailedPreconditionError",
    "FinishedTransfer",
    "InternalError",
    "InvalidArgumentError",
    "KvLayout",
    "LookupResult",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "RegisteredDevice",
    "ResourceExhaustedError",
    "TransferEvent",
    "UnavailableError",
    "UnimplementedError",
    "error_for",
]
