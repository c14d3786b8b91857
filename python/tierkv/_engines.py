"""What the engine connectors (tierkv.vllm, tierkv.sglang) share.

Engine configurations name KV dtypes the way torch does; tierkv's layouts
name them "f32", "f16" and "bf16". Nothing here imports torch: a dtype is
matched by its name, so the connectors import without an engine installed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

# torch's names (str(torch.float16) is "torch.float16") and the words engine
# configurations use ("half", "bfloat16", "auto" resolved by the caller).
_DTYPES = {
    "torch.float32": "f32",
    "float32": "f32",
    "float": "f32",
    "f32": "f32",
    "torch.float16": "f16",
    "float16": "f16",
    "half": "f16",
    "fp16": "f16",
    "f16": "f16",
    "torch.bfloat16": "bf16",
    "bfloat16": "bf16",
    "bf16": "bf16",
}


def layout_dtype(dtype: Any) -> str:
    """The tierkv layout dtype ("f32", "f16", "bf16") of an engine's dtype.

    Raises:
        ValueError: a dtype tierkv does not store (fp8 KV caches, for one).
    """
    name = str(dtype).lower()
    if name in _DTYPES:
        return _DTYPES[name]
    raise ValueError(
        f"KV cache dtype {dtype!r} is not one tierkv stores (float32, "
        "float16, bfloat16); set the engine's KV cache dtype to one of them, "
        "or name it in the connector's extra config ('dtype')")


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """`name` from a dict or an object's attribute, else `default`."""
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


class Backoff:
    """When to try attaching to tierkvd again: at once at first, then `first`
    seconds after a failure, doubling per failure up to `most` (or `first`,
    if that is more); a success starts over. Each try may take a call
    timeout on the engine's path, so a tierkvd that stays away, or refuses,
    is not asked at every call."""

    def __init__(self, first: float, most: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first = first
        self._most = max(most, first)
        self._clock = clock
        self.wait = first  # After the next failure.
        self._at = float("-inf")

    def due(self) -> bool:
        return self._clock() >= self._at

    def left(self) -> float:
        """Seconds until the next try is due (0 when it is)."""
        return max(0.0, self._at - self._clock())

    def failed(self) -> None:
        self._at = self._clock() + self.wait
        self.wait = min(2 * self.wait, self._most)

    def reset(self) -> None:
        self.wait = self._first
