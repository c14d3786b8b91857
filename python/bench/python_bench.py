#!/usr/bin/env python3
"""The Python binding's cost: 2 MiB KV blocks between torch tensors and tierkvd.

What is measured (wall clock; bytes/s counts 2 x blocks x 2 MiB per
iteration, the blocks stored plus the blocks loaded back):

- BM_PythonStoreLoad: Python drives a tierkv.Client attached to a real
  tierkvd, its device a RegisteredDevice over torch bf16 tensors in vLLM's
  paged layout (32 layers, 8 KV heads, head_dim 128, 16-token blocks: 2 MiB
  per block). One iteration stores `blocks` device blocks under a fresh
  prompt (lookup, a miss; allocate; commit; wait_events; complete; finish)
  and loads them back into other device blocks (lookup, a hit; allocate,
  the load; wait_events; complete; finish).
- BM_CppStoreLoad: the same loop in C++ (tierkv._native._bench_store_load)
  on the same client, tensors and tierkvd, in the same run. Short rounds of
  the two alternate (which goes first alternates too), and each reports its
  median round.

BM_PythonStoreLoad's ratio_to_cpp counter is the median, over the pairs of
rounds run back to back, of C++'s time over Python's: the share of the C++
client's throughput Python keeps. Pairing the rounds keeps a machine shared
with other work (a burst of load lasts longer than a pair) from deciding
the ratio.
Before timing, every host slot is written once (first-touch page faults of
the fresh segment would otherwise dominate), and afterwards the loaded
blocks are checked against the stored ones.

Writes Google Benchmark's JSON shape (context + benchmarks) to --out.
Flags Google Benchmark binaries take (--benchmark_*; tools/run bench passes
its arguments to every benchmark) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

import numpy as np
import torch

import tierkv
from tierkv import _native

LAYOUT = tierkv.KvLayout(32, 8, 128, block_size=16, dtype="bf16")


def start_tierkvd(path: str, workdir: str, host_bytes: int) -> tuple[subprocess.Popen, str]:
    """Starts tierkvd and returns it and its socket once it serves."""
    sock = os.path.join(workdir, "tierkvd.sock")
    process = subprocess.Popen(
        [path, "--store", f"pybench{os.getpid()}", "--socket", sock,
         "--layers", str(LAYOUT.num_layers),
         "--kv-heads", str(LAYOUT.num_kv_heads),
         "--head-dim", str(LAYOUT.head_dim),
         "--block-size", str(LAYOUT.block_size), "--dtype", LAYOUT.dtype,
         "--host-capacity", str(host_bytes)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "serving store" in line:
            # Keep reading what it logs, so that it never blocks on the pipe.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, sock
    raise RuntimeError(f"tierkvd exited {process.wait()} before serving")


def complete_transfers(client: tierkv.Client, count: int) -> None:
    while count > 0:
        done = client.wait_events(10.0)
        if not done:
            raise tierkv.UnavailableError("no copy finished in 10 s")
        for finished in done:
            if not finished.ok:
                raise finished.error
        client.complete(done)
        count -= min(count, len(done))


def python_store_load(client: tierkv.Client, iterations: int, blocks: int,
                      first_seed: int, first_request: int) -> float:
    """BM_PythonStoreLoad's loop; the twin of _native._bench_store_load."""
    store_blocks = list(range(blocks))
    load_blocks = list(range(blocks, 2 * blocks))
    length = blocks * client.layout.block_size + 1
    tokens = length - 1
    request = first_request
    start = time.perf_counter()
    for i in range(iterations):
        seed = first_seed + i
        prompt = np.arange(seed * length, (seed + 1) * length, dtype=np.int64)
        put, get, request = request, request + 1, request + 2
        if client.lookup(put, prompt[:tokens]).hit_tokens != 0:
            raise tierkv.InternalError("a store's prompt hit")
        alloc = client.allocate(put, store_blocks, 0)
        if alloc.store_status is not None:
            raise alloc.store_status
        commit = client.commit(put, tokens, store_blocks)
        if commit.store_status is not None:
            raise commit.store_status
        complete_transfers(client, len(commit.stores))
        client.finish(put)
        hit = client.lookup(get, prompt)
        if hit.hit_tokens != tokens:
            raise tierkv.InternalError(f"a load hit {hit.hit_tokens} tokens")
        if client.allocate(get, load_blocks, hit.hit_tokens).load is None:
            raise tierkv.InternalError("a load loaded none")
        complete_transfers(client, 1)
        client.finish(get)
    return time.perf_counter() - start


def measure(loop: Callable[[int, int], float], iterations: int,
            blocks: int, counter: dict[str, int]) -> tuple[float, float]:
    """Runs one round; returns (wall seconds, CPU seconds) per iteration."""
    cpu = time.process_time()
    wall = loop(counter["seed"], counter["request"])
    cpu = time.process_time() - cpu
    counter["seed"] += iterations
    counter["request"] += 2 * iterations
    return wall / iterations, cpu / iterations


def entry(name: str, iterations: int, wall: float, cpu: float,
          bytes_per_iteration: int, **counters: float) -> dict:
    return {
        "name": name, "run_name": name, "run_type": "iteration",
        "repetitions": 1, "repetition_index": 0, "threads": 1,
        "iterations": iterations,
        "real_time": wall * 1e3, "cpu_time": cpu * 1e3, "time_unit": "ms",
        "bytes_per_second": bytes_per_iteration / wall, **counters,
    }


def main() -> int:
    root = pathlib.Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tierkvd", default=os.environ.get(
        "TIERKV_TIERKVD", str(root / "build" / "tools" / "tierkvd")))
    parser.add_argument("--out", default=str(
        root / "build" / "bench" / "results" / "python_bench.json"))
    parser.add_argument("--blocks", type=int, default=8,
                        help="2 MiB blocks stored and loaded per iteration")
    parser.add_argument("--iterations", type=int, default=10,
                        help="iterations per round")
    parser.add_argument("--rounds", type=int, default=15,
                        help="rounds of each loop, alternating")
    parser.add_argument("--host-bytes", type=int, default=256 << 20)
    args, ignored = parser.parse_known_args()
    unknown = [a for a in ignored if not a.startswith("--benchmark_")]
    if unknown:
        parser.error(f"unknown arguments: {' '.join(unknown)}")

    caches = [torch.zeros(2, 2 * args.blocks, LAYOUT.block_size,
                          LAYOUT.num_kv_heads, LAYOUT.head_dim,
                          dtype=torch.bfloat16)
              for _ in range(LAYOUT.num_layers)]
    generator = torch.Generator().manual_seed(15)
    for cache in caches:
        cache[:, :args.blocks] = torch.randn(
            cache[:, :args.blocks].shape, generator=generator)
    device = tierkv.RegisteredDevice.paged(LAYOUT, caches)
    bytes_per_iteration = 2 * args.blocks * LAYOUT.block_bytes

    with tempfile.TemporaryDirectory(prefix="tierkv-pybench-") as workdir:
        daemon, sock = start_tierkvd(args.tierkvd, workdir, args.host_bytes)
        try:
            with tierkv.Client.open(sock, LAYOUT, device=device,
                                    name="python_bench") as client:
                counter = {"seed": 1, "request": 1}
                slots = client.stats()["host"]["capacity_slots"]
                warm = slots // args.blocks + 1
                measure(lambda s, r: python_store_load(
                    client, warm, args.blocks, s, r), warm, args.blocks, counter)

                def cpp(seed: int, request: int) -> float:
                    return _native._bench_store_load(
                        client, args.iterations, args.blocks, seed, request)

                def py(seed: int, request: int) -> float:
                    return python_store_load(
                        client, args.iterations, args.blocks, seed, request)

                rounds: dict[str, list[tuple[float, float]]] = {
                    "cpp": [], "python": []}
                for i in range(args.rounds):
                    order = [("cpp", cpp), ("python", py)]
                    for name, loop in order if i % 2 == 0 else order[::-1]:
                        rounds[name].append(measure(loop, args.iterations,
                                                    args.blocks, counter))
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)

    for cache in caches:
        if not torch.equal(cache[:, args.blocks:], cache[:, :args.blocks]):
            print("python_bench: loaded blocks differ from the stored ones",
                  file=sys.stderr)
            return 1

    def median(name: str) -> tuple[float, float]:
        walls = sorted(rounds[name])
        return walls[len(walls) // 2]

    cpp_wall, cpp_cpu = median("cpp")
    py_wall, py_cpu = median("python")
    ratio = statistics.median(
        c[0] / p[0] for c, p in zip(rounds["cpp"], rounds["python"]))
    total = args.iterations * args.rounds
    result = {
        "context": {
            "date": datetime.datetime.now().astimezone().isoformat(),
            "host_name": socket.gethostname(),
            "executable": " ".join([sys.executable] + sys.argv),
            "num_cpus": os.cpu_count(),
            "library_build_type": "release",
            "python_version": platform.python_version(),
            "torch_version": torch.__version__,
            "layout": str(LAYOUT),
            "blocks_per_iteration": args.blocks,
            "rounds": args.rounds,
        },
        "benchmarks": [
            entry("BM_CppStoreLoad", total, cpp_wall, cpp_cpu,
                  bytes_per_iteration),
            entry("BM_PythonStoreLoad", total, py_wall, py_cpu,
                  bytes_per_iteration, ratio_to_cpp=ratio),
        ],
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for b in result["benchmarks"]:
        print(f"{b['name']:<22} {b['real_time']:8.2f} ms/iteration "
              f"{b['bytes_per_second'] / 2**30:6.2f} GiB/s")
    print(f"python/C++ throughput: {ratio:.1%} (median of {args.rounds} "
          f"pairs of rounds); results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
