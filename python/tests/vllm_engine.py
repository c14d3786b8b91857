"""A small vLLM-shaped engine over torch CPU tensors, for the connector tests.

The test process plays vLLM's engine core: its scheduler owns the
scheduler-side TierkvConnector, allocates device blocks, and each step
builds a SchedulerOutput-shaped object, calls build_connector_meta and sends
the pickled metadata to the worker processes (one per tensor-parallel rank,
started with 'spawn'), as vLLM's executor does. Each worker runs vLLM's
worker-side calls in their order around a "forward" that writes
deterministic KV (kv_values) into its paged KV cache tensors, and returns
get_finished's sets and the load errors; the engine aggregates them across
ranks as vLLM's KVOutputAggregator does (a request is reported once every
rank has) and calls update_connector_output.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import traceback
from types import SimpleNamespace
from typing import Any, Optional

import torch

# Written into every block the engine hands out, so that only a load or the
# "model" can make a block match its expected KV.
SENTINEL = 512.0


def kv_values(tokens: list[int], start: int, end: int, layer: int,
              plane: int, first_head: int, num_heads: int, head_dim: int,
              dtype: torch.dtype, weights: int = 0) -> torch.Tensor:
    """The KV the model (of weights version `weights`) computes for tokens
    [start, end): [end - start, num_heads, head_dim], small integers (exact
    in bf16)."""
    tok = torch.tensor(tokens[start:end], dtype=torch.int64).view(-1, 1, 1)
    pos = torch.arange(start, end, dtype=torch.int64).view(-1, 1, 1)
    head = torch.arange(first_head, first_head + num_heads,
                        dtype=torch.int64).view(1, -1, 1)
    dim = torch.arange(head_dim, dtype=torch.int64).view(1, 1, -1)
    v = (tok * 7 + pos * 13 + layer * 31 + plane * 17 + head * 5 + dim +
         weights * 11) % 251
    return (v - 125).to(dtype)


def vllm_config(extra: dict) -> Any:
    """What the connector reads of vLLM's VllmConfig; the layout comes from
    the extra config (no model config here)."""
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector="TierkvConnector",
            kv_connector_module_path="tierkv.vllm", kv_role="kv_both",
            kv_connector_extra_config=dict(extra)),
        model_config=None, cache_config=None, parallel_config=None)


# ---------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------


class _Worker:
    """One tensor-parallel rank: its KV cache tensors and its connector."""

    def __init__(self, rank: int, extra: dict, num_blocks: int) -> None:
        from tierkv.vllm import KVConnectorRole, TierkvConnector
        self.rank = rank
        extra = dict(extra, rank=rank)
        self.tp = int(extra["tp_size"])
        self.bs = int(extra["block_size"])
        self.heads = int(extra["num_kv_heads"]) // self.tp
        self.head_dim = int(extra["head_dim"])
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16,
                      "f32": torch.float32}[extra["dtype"]]
        self.layers = {
            f"model.layers.{l}.self_attn.attn": torch.full(
                (2, num_blocks, self.bs, self.heads, self.head_dim),
                SENTINEL, dtype=self.dtype)
            for l in range(int(extra["num_layers"]))}
        self.connector = TierkvConnector(vllm_config(extra),
                                         KVConnectorRole.WORKER)
        self.connector.register_kv_caches(self.layers)
        self.weights = 0  # The model's weights version (set_weights).

    def set_weights(self, version: int) -> None:
        self.weights = version

    def _write(self, blocks: list[int], tokens: list[int], start: int,
               end: int) -> None:
        for l, t in enumerate(self.layers.values()):
            for plane in (0, 1):
                kv = kv_values(tokens, start, end, l, plane,
                               self.rank * self.heads, self.heads,
                               self.head_dim, self.dtype, self.weights)
                for p in range(start, end):
                    t[plane, blocks[p // self.bs], p % self.bs] = kv[p - start]

    def step(self, meta: bytes, compute: list, finished: set) -> tuple:
        c = self.connector
        c.bind_connector_metadata(pickle.loads(meta))
        c.start_load_kv(None)
        for name, tensor in self.layers.items():
            c.wait_for_layer_load(name)
            c.save_kv_layer(name, tensor, None)
        for blocks, tokens, start, end in compute:  # The forward.
            self._write(blocks, tokens, start, end)
        c.wait_for_save()
        sending, recving = c.get_finished(finished)
        errors = c.get_block_ids_with_load_errors()
        c.clear_connector_metadata()
        return sending or set(), recving or set(), errors

    def start_only(self, meta: bytes) -> None:
        self.connector.bind_connector_metadata(pickle.loads(meta))
        self.connector.start_load_kv(None)

    def stores_copying(self) -> int:
        """Stores this rank started whose copies are not done yet."""
        return self.connector.tierkv_client.transfers_in_flight

    def fill(self, blocks: list[int]) -> None:
        for t in self.layers.values():
            t[:, blocks] = SENTINEL

    def verify(self, blocks: list[int], tokens: list[int], n: int) -> list:
        """Indices into `blocks` whose KV for tokens [0, n) is not the
        model's."""
        bad = set()
        for l, t in enumerate(self.layers.values()):
            for plane in (0, 1):
                kv = kv_values(tokens, 0, n, l, plane, self.rank * self.heads,
                               self.heads, self.head_dim, self.dtype,
                               self.weights)
                for p in range(n):
                    got = t[plane, blocks[p // self.bs], p % self.bs]
                    if not torch.equal(got, kv[p]):
                        bad.add(p // self.bs)
        return sorted(bad)


def worker_main(conn: Any, rank: int, extra: dict, num_blocks: int) -> None:
    """A worker process: runs the engine's commands until 'close'."""
    worker = None
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "start":
                worker = _Worker(rank, extra, num_blocks)
                result = None
            elif cmd == "close":
                worker.connector.shutdown()
                conn.send(("ok", None))
                return
            elif cmd == "wait":
                result = worker.connector.wait_for_transfers(*args)
            else:
                result = getattr(worker, cmd)(*args)
            conn.send(("ok", result))
        except Exception:  # Reported to the engine, which fails the test.
            conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------


class _Blocks:
    """vLLM's KVCacheBlocks, as the connector reads it."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = list(ids)

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self._ids),)


@dataclasses.dataclass
class Request:
    request_id: str
    tokens: list[int]
    blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    # waiting_kv: an asynchronous load runs; prefill: to compute; done;
    # aborted_recving / delayed: finished, blocks held for the connector.
    state: str = "prefill"
    scheduled: bool = False
    external: int = 0  # Tokens the connector's lookup offered.
    resumed: bool = False  # Preempted: scheduled again as a cached request.
    failed_at: Optional[int] = None  # First block a load failed.
    # What besides its tokens changes its KV, as vLLM's Request has it.
    lora_request: Any = None  # .lora_int_id
    cache_salt: Optional[str] = None
    mm_features: Any = None  # [.identifier, .mm_position.offset/.length]
    prompt_embeds: Any = None
    # Set by vLLM for prompt logprobs and token-level pooling: every prompt
    # token is computed, none read from a cache.
    skip_reading_prefix_cache: bool = False

    # What the connector reads of vLLM's Request.
    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


class WorkerHandle:
    def __init__(self, rank: int, extra: dict, num_blocks: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main,
                                args=(child, rank, extra, num_blocks),
                                daemon=True)
        self.proc.start()
        child.close()
        self.send("start")  # Answered once its connector is registered.

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def receive(self) -> Any:
        status, result = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"worker failed:\n{result}")
        return result

    def call(self, *msg: Any) -> Any:
        self.send(*msg)
        return self.receive()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(30)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("close")
            except (EOFError, OSError):
                pass
            self.proc.join(30)
        self.conn.close()


class Engine:
    """vLLM's engine core in miniature, with TP workers in processes."""

    def __init__(self, extra: dict, num_blocks: int = 32) -> None:
        from tierkv.vllm import KVConnectorRole, TierkvConnector
        self.extra = dict(extra)
        self.tp = int(extra["tp_size"])
        self.bs = int(extra["block_size"])
        self.num_blocks = num_blocks
        self.scheduler = TierkvConnector(
            vllm_config(extra), KVConnectorRole.SCHEDULER,
            SimpleNamespace(num_blocks=num_blocks))  # vLLM's KVCacheConfig.
        self.workers: list[WorkerHandle] = [
            WorkerHandle(r, extra, num_blocks) for r in range(self.tp)]
        for w in self.workers:  # They start side by side.
            w.receive()
        self.free = list(range(num_blocks - 1, -1, -1))
        self.requests: dict[str, Request] = {}
        self.finished_ids: set[str] = set()
        self._recv_counts: dict[str, int] = {}
        self._send_counts: dict[str, int] = {}
        self.received: set[str] = set()  # Every rank reported it.
        self.sent: set[str] = set()
        self.load_errors: set[int] = set()
        # The last step's forward: (blocks, first token, end) per request.
        self.computed: list[tuple] = []
        self.preempted: set[str] = set()
        self.weights = 0  # The workers' weights version (update_weights).

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.scheduler.shutdown()

    # -- blocks --------------------------------------------------------------

    def _alloc(self, n: int) -> list[int]:
        blocks = [self.free.pop() for _ in range(n)]
        for w in self.workers:  # Whatever a block held before is gone.
            w.call("fill", blocks)
        return blocks

    def _release(self, req: Request) -> None:
        self.free.extend(reversed(req.blocks))
        req.blocks = []
        del self.requests[req.request_id]

    # -- requests ------------------------------------------------------------

    def add(self, rid: str, tokens: list[int], **inputs: Any
            ) -> tuple[int, bool]:
        """A new request: the connector's lookup, then its blocks. `inputs`:
        Request's LoRA adapter, cache salt, multimodal items, embeddings."""
        result = self.lookup(rid, tokens, **inputs)
        self.allocate(rid)
        return result

    def lookup(self, rid: str, tokens: list[int], **inputs: Any
               ) -> tuple[int, bool]:
        req = self.requests.get(rid)
        if req is None or req.state != "preempted":
            req = self.requests[rid] = Request(rid, list(tokens), **inputs)
        ext, load_async = self.scheduler.get_num_new_matched_tokens(req, 0)
        req.external = ext or 0
        return ext, load_async

    def allocate(self, rid: str) -> None:
        """The request's blocks: the hit's (loaded) or all (computed)."""
        req = self.requests[rid]
        tokens, ext = req.tokens, req.external
        if ext:
            req.blocks = self._alloc(-(-ext // self.bs))
            req.state = "waiting_kv"
        else:
            req.blocks = self._alloc(-(-len(tokens) // self.bs))
        self.scheduler.update_state_after_alloc(req, _Blocks(req.blocks), ext)

    def preempt(self, rid: str) -> None:
        """vLLM's _preempt_request: blocks freed, everything to recompute;
        `resume` looks it up again."""
        req = self.requests[rid]
        self.free.extend(reversed(req.blocks))
        req.blocks, req.num_computed, req.scheduled = [], 0, False
        req.state, req.resumed = "preempted", True
        self.preempted.add(rid)

    def resume(self, rid: str) -> tuple[int, bool]:
        result = self.lookup(rid, self.requests[rid].tokens)
        req = self.requests[rid]
        req.state = "prefill"
        self.allocate(rid)
        return result

    def finish(self, rid: str) -> bool:
        """The request finished or was aborted: vLLM's _free_request. Returns
        the connector's delay_free."""
        req = self.requests[rid]
        delay, _ = self.scheduler.request_finished(req, list(req.blocks))
        self.finished_ids.add(rid)
        if req.state == "waiting_kv":
            # vLLM frees it once the workers report it received.
            assert not delay, "delay_free for a request vLLM delays itself"
            req.state = "aborted_recving"
        elif delay:
            req.state = "delayed"
        else:
            self._release(req)
        return delay

    def _loaded(self, req: Request) -> None:
        """vLLM's _update_waiting_for_remote_kv, then the allocation of the
        rest of its blocks."""
        if req.failed_at is not None:
            req.num_computed = req.failed_at * self.bs
        else:
            req.num_computed = min(len(req.blocks) * self.bs,
                                   len(req.tokens) - 1)
        need = -(-len(req.tokens) // self.bs) - len(req.blocks)
        req.blocks += self._alloc(need)
        req.state = "prefill"
        self.scheduler.update_state_after_alloc(req, _Blocks(req.blocks), 0)

    # -- steps ---------------------------------------------------------------

    def build(self) -> tuple[bytes, list, set]:
        """schedule(): the SchedulerOutput, the connector's metadata (pickled,
        as sent to workers) and what the forward computes."""
        new, compute, scheduled = [], [], {}
        cached = SimpleNamespace(req_ids=[], new_block_ids=[],
                                 num_computed_tokens=[],
                                 resumed_req_ids=set())
        for req in self.requests.values():
            if req.state != "prefill" or req.scheduled:
                continue
            if req.resumed:  # Its whole block list, anew.
                cached.req_ids.append(req.request_id)
                cached.new_block_ids.append((list(req.blocks),))
                cached.num_computed_tokens.append(req.num_computed)
                cached.resumed_req_ids.add(req.request_id)
            else:
                new.append(SimpleNamespace(
                    req_id=req.request_id, block_ids=(list(req.blocks),),
                    num_computed_tokens=req.num_computed,
                    prompt_token_ids=req.tokens))
            scheduled[req.request_id] = len(req.tokens) - req.num_computed
            compute.append((list(req.blocks), req.tokens, req.num_computed,
                            len(req.tokens)))
            req.scheduled = True
        out = SimpleNamespace(
            scheduled_new_reqs=new, scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            finished_req_ids=self.finished_ids,
            preempted_req_ids=self.preempted)
        self.finished_ids, self.preempted = set(), set()
        self.computed = [(c[0], c[2], c[3]) for c in compute]
        meta = self.scheduler.build_connector_meta(out)
        for req in self.requests.values():
            if req.scheduled and req.state == "prefill":
                req.state = "done"
                req.num_computed = len(req.tokens)
        return pickle.dumps(meta), compute, out.finished_req_ids

    def step(self) -> SimpleNamespace:
        """One engine step: schedule, every worker's forward, the output."""
        meta, compute, finished = self.build()
        for w in self.workers:
            w.send("step", meta, compute, finished)
        return self.collect([w.receive() for w in self.workers])

    def collect(self, replies: list[tuple]) -> SimpleNamespace:
        """update_from_output: aggregates the ranks' replies."""
        out = SimpleNamespace(finished_sending=set(), finished_recving=set(),
                              invalid_block_ids=set())
        for sending, recving, errors in replies:
            out.invalid_block_ids |= set(errors)
            for rid in sending:
                self._send_counts[rid] = self._send_counts.get(rid, 0) + 1
            for rid in recving:
                self._recv_counts[rid] = self._recv_counts.get(rid, 0) + 1
        for counts, done in ((self._send_counts, out.finished_sending),
                             (self._recv_counts, out.finished_recving)):
            for rid, n in list(counts.items()):
                if n >= self.tp:
                    done.add(rid)
                    del counts[rid]
        self._apply(out)
        return out

    def _apply(self, out: SimpleNamespace) -> None:
        self.load_errors |= out.invalid_block_ids
        for req in self.requests.values():
            if req.state != "waiting_kv" or req.failed_at is not None:
                continue
            for i, block in enumerate(req.blocks):
                if block in out.invalid_block_ids:
                    req.failed_at = i
                    break
        self.scheduler.update_connector_output(out)
        self.received |= out.finished_recving
        self.sent |= out.finished_sending
        for rid in out.finished_recving:
            req = self.requests[rid]
            if req.state == "aborted_recving":
                self._release(req)
            else:
                assert req.state == "waiting_kv", (rid, req.state)
                self._loaded(req)
        for rid in out.finished_sending:
            req = self.requests[rid]
            assert req.state == "delayed", (rid, req.state)
            self._release(req)

    def run_until(self, done, max_steps: int = 50) -> None:
        """Steps until done() holds; between steps the workers wait for a
        copy in flight to finish (no step waits on time)."""
        for _ in range(max_steps):
            self.step()
            if done():
                return
            for w in self.workers:
                w.call("wait", 5.0)
        raise AssertionError(f"not done after {max_steps} steps")

    def verify(self, rid: str, n: int) -> dict[int, list]:
        """Per rank, the blocks of `rid` whose KV for tokens [0, n) is not
        the model's (empty lists: every byte right)."""
        req = self.requests[rid]
        return {r: w.call("verify", list(req.blocks), req.tokens, n)
                for r, w in enumerate(self.workers)}

    def update_weights(self) -> None:
        """An RL weight update: every rank's model computes other KV from
        now on, and vLLM's reset_prefix_cache resets the connector's cache
        (reset_connector=True)."""
        self.weights += 1
        for w in self.workers:
            w.call("set_weights", self.weights)
        assert self.scheduler.reset_cache() is True

    def replace_worker(self, rank: int) -> None:
        """A worker died: a new process takes its rank. The reports the dead
        one never sent (tierkvd failed its copies) count as sent, for the
        requests waiting on the workers. REQUIRES: the dead worker had
        reported none of them.

        vLLM itself ends the engine when a worker process dies; it does not
        replace one. A test using this proves tierkv's side only: tierkvd
        releases the dead rank's slots, and a rank client attached anew
        serves correct bytes. It says nothing about vLLM's behaviour."""
        old = self.workers[rank]
        if old.proc.is_alive():
            old.kill()
        old.conn.close()
        self.workers[rank] = WorkerHandle(rank, self.extra, self.num_blocks)
        self.workers[rank].receive()
        self.workers[rank].call("set_weights", self.weights)
        for rid, req in self.requests.items():
            if req.state in ("waiting_kv", "aborted_recving"):
                self._recv_counts[rid] = self._recv_counts.get(rid, 0) + 1
            elif req.state == "delayed":
                self._send_counts[rid] = self._send_counts.get(rid, 0) + 1
