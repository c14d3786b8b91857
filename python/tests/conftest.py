"""pytest fixtures for the tierkv package's tests: real tierkvd processes.

Every test file in python/tests may use these fixtures:

``tierkvd_path``
    The tierkvd binary: $TIERKV_TIERKVD (ctest sets it to the one built
    next to the package), else build/tools/tierkvd under the checkout.
``layout``
    ``DEFAULT_LAYOUT``: 2 layers, 2 KV heads, head_dim 64, 16-token blocks,
    bf16 (16 KiB blocks; the heads split over two tensor-parallel ranks).
``start_tierkvd``
    A factory: ``start_tierkvd(layout=DEFAULT_LAYOUT, host_bytes=4 << 20,
    model="", disk_dir=None, extra_args=())`` starts a tierkvd on a socket of
    its own, waits until it serves, and returns a :class:`Tierkvd`. Every
    tierkvd it started is stopped (SIGTERM) when the test ends, and its
    shared memory removed even if it was killed.
``tierkvd``
    ``start_tierkvd()``: one tierkvd with the defaults.

A :class:`Tierkvd` has ``socket``, ``store``, ``layout``, ``process``,
``output()`` (what it logged), ``stop()`` (SIGTERM, waits, asserts a clean
exit) and ``kill()`` (SIGKILL, waits).
"""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Callable, Iterator, Sequence

import pytest

import tierkv

DEFAULT_LAYOUT = tierkv.KvLayout(2, 2, 64, block_size=16, dtype="bf16")

_READY_LINE = "serving store"
_START_TIMEOUT_S = 30.0
_store_numbers = itertools.count()


class Tierkvd:
    """A tierkvd process started for a test."""

    def __init__(self, path: str, layout: tierkv.KvLayout, host_bytes: int,
                 model: str, disk_dir: str | None,
                 extra_args: Sequence[str]) -> None:
        self.layout = layout
        self.store = f"py{os.getpid()}-{next(_store_numbers)}"
        # A short directory of its own: a socket path must fit in 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="tierkv-py-")
        self.socket = os.path.join(self.dir, "tierkvd.sock")
        args = [
            path, "--store", self.store, "--socket", self.socket,
            "--layers", str(layout.num_layers),
            "--kv-heads", str(layout.num_kv_heads),
            "--head-dim", str(layout.head_dim),
            "--block-size", str(layout.block_size),
            "--dtype", layout.dtype,
            "--host-capacity", str(host_bytes),
        ]
        if model:
            args += ["--model", model]
        if disk_dir is not None:
            args += ["--disk-dir", disk_dir]
        args += list(extra_args)
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._wait_ready()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._lines.append("")  # End of output: the process exited.
            self._changed.notify_all()

    def _wait_ready(self) -> None:
        def ready_or_gone() -> bool:
            return any(_READY_LINE in line for line in self._lines) or (
                bool(self._lines) and self._lines[-1] == "")

        with self._changed:
            self._changed.wait_for(ready_or_gone, timeout=_START_TIMEOUT_S)
            ready = any(_READY_LINE in line for line in self._lines)
        if not ready:
            self.kill()
            raise RuntimeError(
                f"tierkvd did not start serving:\n{self.output()}")

    def output(self) -> str:
        """Everything tierkvd has logged so far."""
        with self._changed:
            return "".join(self._lines)

    def stop(self) -> None:
        """SIGTERM: a clean stop; asserts tierkvd exits 0."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self._reader.join()
        assert code == 0, f"tierkvd exited {code}:\n{self.output()}"

    def kill(self) -> None:
        """SIGKILL, as a crash: leaves its shared memory behind."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=60)
        self._reader.join()

    def cleanup(self) -> None:
        for entry in pathlib.Path("/dev/shm").glob(f"tierkv.{self.store}.*"):
            entry.unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def tierkvd_path() -> str:
    path = os.environ.get("TIERKV_TIERKVD")
    if not path:
        root = pathlib.Path(__file__).resolve().parents[2]
        path = str(root / "build" / "tools" / "tierkvd")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no tierkvd at {path}: build it (cmake --build build "
                    "--target tierkvd) or set TIERKV_TIERKVD")
    return path


@pytest.fixture
def layout() -> tierkv.KvLayout:
    return DEFAULT_LAYOUT


@pytest.fixture
def start_tierkvd(tierkvd_path: str) -> Iterator[Callable[..., Tierkvd]]:
    started: list[Tierkvd] = []

    def start(layout: tierkv.KvLayout = DEFAULT_LAYOUT,
              host_bytes: int = 4 << 20, model: str = "",
              disk_dir: str | None = None,
              extra_args: Sequence[str] = ()) -> Tierkvd:
        daemon = Tierkvd(tierkvd_path, layout, host_bytes, model, disk_dir,
                         extra_args)
        started.append(daemon)
        return daemon

    yield start
    try:
        for daemon in started:
            if daemon.process.poll() is None:
                daemon.stop()
    finally:
        for daemon in started:
            daemon.kill()
            daemon.cleanup()


@pytest.fixture
def tierkvd(start_tierkvd: Callable[..., Tierkvd]) -> Tierkvd:
    return start_tierkvd()
