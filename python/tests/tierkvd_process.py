"""A real tierkvd process for the Python tests.

Starts build/tools/tierkvd (or $TIERKV_TIERKVD) on a socket in a private
directory and waits for the line it logs once it serves; stops it cleanly,
or kills it, and removes what a killed one left under /dev/shm.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import threading
from typing import Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def tierkvd_path() -> str:
    return os.environ.get("TIERKV_TIERKVD",
                          os.path.join(_ROOT, "build", "tools", "tierkvd"))


class Tierkvd:
    """One tierkvd: a store named `store`, serving on `socket`."""

    def __init__(self, directory: str, store: str, *, layers: int,
                 kv_heads: int, head_dim: int, block_size: int = 16,
                 dtype: str = "bf16", host_capacity: str = "4M",
                 model: str = "", extra: tuple[str, ...] = ()) -> None:
        self.store = store
        self.socket = os.path.join(directory, "tierkvd.sock")
        self._args = [tierkvd_path(), "--store", store, "--socket",
                      self.socket, "--layers", str(layers), "--kv-heads",
                      str(kv_heads), "--head-dim", str(head_dim),
                      "--block-size", str(block_size), "--dtype", dtype,
                      "--host-capacity", host_capacity, *extra]
        if model:
            self._args += ["--model", model]
        self._proc: Optional[subprocess.Popen] = None
        self._lines: list[str] = []
        self._serving = threading.Event()

    def start(self, timeout: float = 30.0) -> "Tierkvd":
        self._serving.clear()
        self._lines = []
        self._proc = subprocess.Popen(self._args, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, args=(self._proc,),
                         daemon=True).start()
        if not self._serving.wait(timeout) or self._proc.poll() is not None:
            out = self.output()
            self.kill()
            raise RuntimeError(f"tierkvd did not start: {out}")
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        # Drains tierkvd's output so it never blocks on a full pipe.
        for line in proc.stdout:
            self._lines.append(line)
            if "serving store" in line:
                self._serving.set()
        self._serving.set()  # Exited: start() sees it.

    def output(self) -> str:
        return "".join(self._lines)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> int:
        """SIGTERM, a clean stop; its exit status."""
        if self._proc is None:
            return 0
        self._proc.send_signal(signal.SIGTERM)
        status = self._proc.wait(30)
        self._proc = None
        return status

    def kill(self) -> None:
        """SIGKILL, then removes what the killed tierkvd left behind."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(30)
            self._proc = None
        for path in glob.glob(f"/dev/shm/tierkv.{self.store}.*"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
