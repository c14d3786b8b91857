"""tierkv.vllm's connector driven in vLLM's call order: a scheduler (this
process) and two tensor-parallel worker processes against a real tierkvd,
KV verified byte for byte on each rank."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from types import SimpleNamespace

import pytest
import torch

import tierkv
import tierkv.vllm
from vllm_engine import Engine, vllm_config

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 2, 4, 64, 16
PREFIX = list(range(1000, 1000 + 4 * BLOCK))  # Four full blocks.


def _layout() -> tierkv.KvLayout:
    return tierkv.KvLayout(LAYERS, KV_HEADS, HEAD_DIM, block_size=BLOCK,
                           dtype="bf16")


@pytest.fixture
def daemon(start_tierkvd):
    return start_tierkvd(layout=_layout())


@pytest.fixture
def socket_link(tmp_path, daemon):
    """The connectors' socket path: a link to the tierkvd serving now, so a
    tierkvd started later (on a socket of its own) takes its place."""
    link = os.path.join(str(tmp_path), "tierkvd.sock")
    os.symlink(daemon.socket, link)
    return link


@pytest.fixture
def engine(socket_link):
    e = Engine({"socket": socket_link, "model": "", "num_layers": LAYERS,
                "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                "block_size": BLOCK, "dtype": "bf16", "tp_size": 2,
                "call_timeout": 5.0, "reconnect_wait": 0})
    yield e
    e.close()


def _observer(daemon) -> tierkv.Client:
    return tierkv.Client.open(daemon.socket, _layout(), 1, name="observer")


def _settled(observer: tierkv.Client, workers: int) -> dict:
    """tierkvd's stats once `workers` workers are attached and no transfer
    is in flight (tierkvd notices a killed worker when its socket closes)."""
    deadline = time.monotonic() + 20
    while True:
        observer.wait_idle(20.0)
        s = observer.stats()
        if (s["host"]["events_in_flight"] == 0 and
                len(s["workers"]) == workers) or time.monotonic() > deadline:
            return s
        # Idle, but a worker's socket close not yet seen: the observer has
        # no transfers, so this blocks (without spinning) between checks.
        observer.wait_events(0.02)


def _attached(engine: Engine) -> bool:
    """Whether the scheduler's connector is attached (a lost client is
    closed until it attaches anew)."""
    client = engine.scheduler.tierkv_client
    return client is not None and not client.closed and client.connected


def _store_prefix(engine: Engine, rid: str, tokens: list[int],
                  **inputs) -> None:
    """A request computes `tokens` and finishes; its stores are copied."""
    assert engine.add(rid, tokens, **inputs) == (0, False)
    engine.step()
    assert engine.finish(rid) is True  # Freed once the workers report.
    engine.run_until(lambda: rid in engine.sent)


def test_a_vllm_without_load_error_reports_is_refused(monkeypatch):
    class OldBase:
        """A vLLM KVConnectorBase_V1 from before load-error reports."""

    monkeypatch.setattr(tierkv.vllm, "HAVE_VLLM", True)
    monkeypatch.setattr(tierkv.vllm, "KVConnectorBase_V1", OldBase)
    with pytest.raises(ValueError, match="get_block_ids_with_load_errors"):
        tierkv.vllm.TierkvConnector(vllm_config({"socket": "/nonexistent"}),
                                    tierkv.vllm.KVConnectorRole.WORKER)


def test_config_from_vllm_without_vllm_installed():
    assert not tierkv.vllm.HAVE_VLLM
    model = SimpleNamespace(
        model="org/model", dtype="torch.bfloat16",
        get_num_layers=lambda parallel: 32,
        get_total_num_kv_heads=lambda: 8, get_head_size=lambda: 128)
    config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config={"socket": "/tmp/x.sock"}),
        model_config=model,
        cache_config=SimpleNamespace(block_size=16, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=2,
                                        pipeline_parallel_size=1))
    c = tierkv.vllm.TierkvConfig.from_vllm_config(
        config, SimpleNamespace(num_blocks=1000))
    assert c.layout == tierkv.KvLayout(32, 8, 128, block_size=16,
                                       dtype="bf16")
    assert (c.socket, c.model, c.tp_size, c.num_device_blocks) == (
        "/tmp/x.sock", "org/model", 2, 1000)
    config.cache_config.cache_dtype = "fp8"
    with pytest.raises(ValueError, match="fp8"):
        tierkv.vllm.TierkvConfig.from_vllm_config(config)
    config.kv_transfer_config.kv_connector_extra_config["dtype"] = "f16"
    assert tierkv.vllm.TierkvConfig.from_vllm_config(
        config).layout.dtype == "f16"
    assert tierkv.vllm.TierkvConfig.from_vllm_config(
        config).copy_engine == "auto"
    config.kv_transfer_config.kv_connector_extra_config["copy_engine"] = "cuda"
    with pytest.raises(ValueError, match="copy_engine"):
        tierkv.vllm.TierkvConfig.from_vllm_config(config)


class FullAttentionSpec:
    """vLLM's spec classes, as the connector tells them apart: by name."""


class MLAAttentionSpec(FullAttentionSpec):
    pass


class SlidingWindowSpec:
    pass


class MambaSpec:
    pass


def test_config_refuses_what_would_fail_requests_or_store_wrong_kv():
    def config(**transfer):
        return SimpleNamespace(
            kv_transfer_config=SimpleNamespace(
                kv_connector_extra_config={
                    "num_layers": 2, "num_kv_heads": 2, "head_dim": 8},
                **transfer),
            model_config=None, cache_config=None, parallel_config=None)

    def groups(*specs):
        return SimpleNamespace(num_blocks=64, kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=spec()) for spec in specs])

    from_vllm = tierkv.vllm.TierkvConfig.from_vllm_config
    # vLLM's default policy fails a request whose load tierkv cannot finish.
    with pytest.raises(ValueError, match="\"recompute\""):
        from_vllm(config(kv_load_failure_policy="fail"))
    assert from_vllm(config(kv_load_failure_policy="recompute")).layout
    assert from_vllm(config()).layout  # A vLLM without the setting.
    # Full attention in one group, a subclass of it too; nothing else.
    assert from_vllm(config(), groups(FullAttentionSpec)).num_device_blocks \
        == 64
    for spec in (SlidingWindowSpec, MambaSpec, MLAAttentionSpec):
        with pytest.raises(ValueError, match=spec.__name__):
            from_vllm(config(), groups(spec))
    with pytest.raises(ValueError, match="2 KV cache groups"):
        from_vllm(config(), groups(FullAttentionSpec, SlidingWindowSpec))


@pytest.mark.parametrize("shape", [
    (2, 8, BLOCK, KV_HEADS // 2, HEAD_DIM),  # vLLM's FlashAttention layout.
    (8, 2, BLOCK, KV_HEADS // 2, HEAD_DIM),  # FlashInfer's.
])
@pytest.mark.parametrize("copy_engine", ["tierkv", "torch"])
def test_worker_registers_paged_kv_caches_of_its_shard(shape, copy_engine):
    extra = {"num_layers": LAYERS, "num_kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "block_size": BLOCK, "dtype": "bf16",
             "tp_size": 2, "rank": 1, "model": "", "copy_engine": copy_engine}
    worker = tierkv.vllm.TierkvConnector(vllm_config(extra),
                                         tierkv.vllm.KVConnectorRole.WORKER)
    caches = {f"layer.{l}": torch.zeros(shape, dtype=torch.bfloat16)
              for l in range(LAYERS)}
    worker.register_kv_caches(caches)  # Attaches on the first metadata.
    assert worker.tierkv_client is None
    # Every head instead of this rank's half: refused, naming the shape.
    whole = {name: torch.zeros(shape[:3] + (KV_HEADS, HEAD_DIM),
                               dtype=torch.bfloat16) for name in caches}
    with pytest.raises(tierkv.InvalidArgumentError, match="shape"):
        worker.register_kv_caches(whole)
    # Another dtype than the layout's: refused, naming it.
    f16 = {name: t.to(torch.float16) for name, t in caches.items()}
    with pytest.raises(tierkv.InvalidArgumentError, match="dtype|bf16"):
        worker.register_kv_caches(f16)


def test_auto_copies_with_torch_for_caches_off_the_host():
    """tierkv's copy engine reads host memory only: caches anywhere else (a
    GPU's; here torch's meta device, which holds no memory) get torch's."""
    extra = {"num_layers": LAYERS, "num_kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "block_size": BLOCK, "dtype": "bf16",
             "tp_size": 1, "rank": 0, "model": ""}
    shape = (2, 8, BLOCK, KV_HEADS, HEAD_DIM)
    for device, torch_copies in (("cpu", False), ("meta", True)):
        worker = tierkv.vllm.TierkvConnector(
            vllm_config(extra), tierkv.vllm.KVConnectorRole.WORKER)
        worker.register_kv_caches({
            f"layer.{l}": torch.empty(shape, dtype=torch.bfloat16,
                                      device=device)
            for l in range(LAYERS)})
        assert (worker._worker._copier is not None) == torch_copies, device


def test_a_two_block_cache_needs_its_layout_named():
    extra = {"num_layers": LAYERS, "num_kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "block_size": BLOCK, "dtype": "bf16",
             "tp_size": 1, "rank": 0, "model": ""}
    shape = (2, 2, BLOCK, KV_HEADS, HEAD_DIM)  # Paged or FlashInfer's?
    caches = {f"layer.{l}": torch.zeros(shape, dtype=torch.bfloat16)
              for l in range(LAYERS)}
    worker = tierkv.vllm.TierkvConnector(vllm_config(extra),
                                         tierkv.vllm.KVConnectorRole.WORKER)
    with pytest.raises(ValueError, match="kv_layout"):
        worker.register_kv_caches(caches)
    for name in ("paged", "flashinfer"):
        worker = tierkv.vllm.TierkvConnector(
            vllm_config(dict(extra, kv_layout=name)),
            tierkv.vllm.KVConnectorRole.WORKER)
        worker.register_kv_caches(caches)
    paged = (2, 8, BLOCK, KV_HEADS, HEAD_DIM)
    worker = tierkv.vllm.TierkvConnector(
        vllm_config(dict(extra, kv_layout="flashinfer")),
        tierkv.vllm.KVConnectorRole.WORKER)
    with pytest.raises(ValueError, match="'flashinfer' layout"):
        worker.register_kv_caches(
            {n: torch.zeros(paged, dtype=torch.bfloat16) for n in caches})
    with pytest.raises(ValueError, match="kv_layout"):
        tierkv.vllm.TierkvConnector(
            vllm_config(dict(extra, kv_layout="nhd")),
            tierkv.vllm.KVConnectorRole.WORKER)


def test_scheduler_refuses_a_layout_tierkvd_does_not_serve(daemon):
    with pytest.raises(tierkv.FailedPreconditionError):
        tierkv.vllm.TierkvConnector(
            vllm_config({"socket": daemon.socket, "model": "",
                         "num_layers": LAYERS + 1, "num_kv_heads": KV_HEADS,
                         "head_dim": HEAD_DIM, "block_size": BLOCK,
                         "dtype": "bf16", "tp_size": 2,
                         "num_device_blocks": 8}),
            tierkv.vllm.KVConnectorRole.SCHEDULER)


def test_stored_prefix_loads_on_both_ranks(engine, daemon):
    _store_prefix(engine, "r1", PREFIX + [5, 6, 7])
    observer = _observer(daemon)
    assert observer.stats()["host"]["cached_slots"] == 4

    tokens = PREFIX + [9] * 6
    assert engine.add("r2", tokens) == (64, True)
    engine.run_until(lambda: "r2" in engine.received)
    assert engine.load_errors == set()
    # The blocks held the sentinel until the load: both shards came back.
    assert engine.verify("r2", 64) == {0: [], 1: []}
    engine.step()  # Computes the six tokens after the hit.
    assert engine.verify("r2", len(tokens)) == {0: [], 1: []}
    assert engine.finish("r2") is False  # Nothing new to store.

    stats = _settled(observer, workers=4)
    assert stats["host"]["pinned_slots"] == 0
    assert stats["host"]["loads_completed"] == 4


def test_torch_copies_and_tierkvs_serve_each_other(socket_link, daemon):
    """Ranks that copy with torch (as on a GPU: copies="caller" through the
    host slots) store and load the same bytes as tierkv's copy engine: each
    loads what the other stored, verified on both ranks."""
    extra = {"socket": socket_link, "model": "", "num_layers": LAYERS,
             "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
             "block_size": BLOCK, "dtype": "bf16", "tp_size": 2,
             "reconnect_wait": 0}
    other = list(range(5000, 5000 + 3 * BLOCK))
    for first, second in (("torch", "tierkv"), ("tierkv", "torch")):
        prompt = PREFIX + [len(first)] if first == "torch" else other + [1]
        e = Engine(dict(extra, copy_engine=first))
        try:
            _store_prefix(e, "store", prompt)
        finally:
            e.close()
        e = Engine(dict(extra, copy_engine=second))
        try:
            hit = len(prompt) - 1
            assert e.add("load", prompt[:-1] + [99]) == (hit, True)
            e.run_until(lambda: "load" in e.received)
            assert e.load_errors == set()
            assert e.verify("load", hit) == {0: [], 1: []}
        finally:
            e.close()
    stats = _settled(_observer(daemon), workers=1)
    assert stats["host"]["pinned_slots"] == 0
    assert stats["host"]["stores_failed"] == 0


def _image(identifier: str) -> list:
    """vLLM's mm_features: one image on placeholder tokens [20, 28), in the
    second block."""
    return [SimpleNamespace(identifier=identifier,
                            mm_position=SimpleNamespace(offset=20, length=8))]


def test_adapters_salts_and_images_key_the_blocks_apart(engine, daemon):
    # The same token ids, each computed under other inputs: its KV differs,
    # so none may be served to another (vLLM's prefix cache keys them
    # apart too).
    tokens = PREFIX + [5, 6, 7]
    # Adapters are named alike on every vLLM instance, numbered per process.
    lora = [SimpleNamespace(lora_int_id=1, lora_name=f"a{n}") for n in (0, 1, 2)]
    _store_prefix(engine, "plain", tokens)
    _store_prefix(engine, "lora1", tokens, lora_request=lora[1])
    _store_prefix(engine, "salted", tokens, cache_salt="tenant-a")
    # The image's first block holds no placeholder: the plain prompt's,
    # loaded; the three after it are the image's own.
    assert engine.add("cat", tokens, mm_features=_image("cat-sha256")) == (
        BLOCK, True)
    engine.run_until(lambda: "cat" in engine.received)
    engine.step()
    assert engine.finish("cat") is True
    engine.run_until(lambda: "cat" in engine.sent)
    observer = _observer(daemon)
    assert observer.stats()["host"]["cached_slots"] == 4 + 4 + 4 + 3
    # Each finds its own blocks, and only those.
    for rid, inputs, hit in [
            ("q-plain", {}, 64), ("q-lora1", {"lora_request": lora[1]}, 64),
            ("q-lora2", {"lora_request": lora[2]}, 0),
            ("q-salted", {"cache_salt": "tenant-a"}, 64),
            ("q-salt-b", {"cache_salt": "tenant-b"}, 0),
            ("q-cat", {"mm_features": _image("cat-sha256")}, 64),
            ("q-dog", {"mm_features": _image("dog-sha256")}, BLOCK)]:
        assert engine.add(rid, tokens, **inputs) == (hit, hit > 0), rid
        if hit:
            engine.run_until(lambda: rid in engine.received)
            assert engine.verify(rid, hit) == {0: [], 1: []}, rid
        engine.step()
        if engine.finish(rid):
            engine.run_until(lambda: rid in engine.sent)
    # Prompt embeddings: token ids say nothing of the KV, so tierkv neither
    # serves nor stores it.
    assert engine.add("embeds", tokens, prompt_embeds=object()) == (0, False)
    engine.step()
    assert engine.finish("embeds") is False
    # A request stored under the unnamed inputs stays found, after all.
    assert engine.add("again", tokens) == (64, True)
    engine.run_until(lambda: "again" in engine.received)
    engine.step()
    engine.finish("again")
    stats = _settled(observer, workers=4)
    assert stats["host"]["pinned_slots"] == 0
    # And what the misses computed: lora2's and salt-b's four, dog's three.
    assert stats["host"]["cached_slots"] == 15 + 4 + 4 + 3


def test_a_request_that_skips_the_prefix_cache_is_not_served_but_stores(
        engine, daemon):
    """vLLM sets skip_reading_prefix_cache for prompt logprobs and
    token-level pooling: it must compute every prompt token (a hit would
    cut the logprobs short). tierkv offers none, and stores what it
    computes."""
    _store_prefix(engine, "r1", PREFIX + [5, 6, 7])
    observer = _observer(daemon)
    assert observer.stats()["host"]["cached_slots"] == 4
    tokens = PREFIX[:2 * BLOCK] + [8] * (2 * BLOCK) + [9]
    assert engine.add("r2", tokens, skip_reading_prefix_cache=True) == (
        0, False)
    engine.step()
    assert engine.verify("r2", len(tokens)) == {0: [], 1: []}
    assert engine.finish("r2") is True  # Its two new blocks are stored.
    engine.run_until(lambda: "r2" in engine.sent)
    stats = _settled(observer, workers=4)
    assert stats["host"]["loads_completed"] == 0
    assert stats["host"]["cached_slots"] == 6


def test_a_cache_reset_serves_nothing_cached_before(engine, daemon):
    """vLLM's reset_prefix_cache(reset_connector=True), after new weights:
    no block stored before is served again, whether the request carries a
    cache salt or is waiting since before the reset; what is stored after
    it is served as ever."""
    salted = [7] * (2 * BLOCK) + [8]
    _store_prefix(engine, "r1", PREFIX + [5])
    _store_prefix(engine, "s1", salted, cache_salt="tenant-a")
    assert engine.lookup("waiting", PREFIX + [6]) == (64, True)
    assert engine.lookup("s2", salted, cache_salt="tenant-a") == (32, True)

    assert engine.scheduler.reset_cache() is True
    # Asked again while waiting: the same tierkv request, new keys.
    assert engine.lookup("waiting", PREFIX + [6]) == (0, False)
    assert engine.lookup("s2", salted, cache_salt="tenant-a") == (0, False)
    # What they compute now is stored under the new generation and served.
    engine.allocate("waiting")
    engine.allocate("s2")
    engine.step()
    assert engine.finish("waiting") is True
    assert engine.finish("s2") is True
    engine.run_until(lambda: {"waiting", "s2"} <= engine.sent)
    assert engine.add("s3", salted, cache_salt="tenant-a") == (32, True)
    assert engine.add("r3", PREFIX + [9]) == (64, True)
    engine.run_until(lambda: {"r3", "s3"} <= engine.received)
    assert engine.verify("r3", 64) == {0: [], 1: []}
    assert engine.verify("s3", 32) == {0: [], 1: []}
    # The old blocks are still there for engines on the old weights.
    observer = _observer(daemon)
    assert observer.lookup(1, PREFIX + [5], 0).hit_tokens == 64
    observer.finish(1)


def test_a_request_looked_up_before_a_reset_stores_nothing_after_it(
        engine, daemon):
    """A request whose lookup came before the reset computes what follows
    its hit under the new weights; its keys are the old generation's, so
    none of that is stored (an engine on the old weights would load it)."""
    _store_prefix(engine, "r1", PREFIX + [5])
    tokens = PREFIX + [3] * (2 * BLOCK) + [4]
    assert engine.add("old", tokens) == (64, True)
    assert engine.scheduler.reset_cache() is True
    engine.run_until(lambda: "old" in engine.received)
    engine.step()  # Its last two blocks, after the reset.
    assert engine.computed == [(engine.requests["old"].blocks, 64,
                                len(tokens))]
    assert engine.finish("old") is False  # Nothing is being stored.
    observer = _observer(daemon)
    stats = _settled(observer, workers=4)
    assert stats["host"]["cached_slots"] == 4
    assert observer.lookup(1, tokens, 0).hit_tokens == 64
    observer.finish(1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_requests_and_weight_updates_never_load_wrong_kv(
        socket_link, seed):
    """A seeded random mix of what an engine does: requests on shared
    prefixes, finished or aborted (during their loads too), preempted and
    resumed, and weight updates between batches (the engine idle, as RL
    pauses generation) with reset_cache. Every request's KV is checked
    against the model of the weights it ran under, once computed."""
    rng = random.Random(seed)
    engine = Engine({"socket": socket_link, "model": "",
                     "num_layers": LAYERS, "num_kv_heads": KV_HEADS,
                     "head_dim": HEAD_DIM, "block_size": BLOCK,
                     "dtype": "bf16", "tp_size": 2, "call_timeout": 5.0,
                     "reconnect_wait": 0}, num_blocks=64)
    prefixes = [[rng.randrange(1, 30000) for _ in range(n * BLOCK)]
                for n in (1, 2, 3)]
    verified: set[str] = set()
    checks = hits = updates = 0
    try:
        for i in range(120):
            states = {rid: r.state for rid, r in engine.requests.items()}
            done = [rid for rid, st in states.items() if st == "done"]
            loading = [rid for rid, st in states.items()
                       if st == "waiting_kv"]
            roll = rng.random()
            if roll < 0.35 and len(engine.free) >= 12:
                tokens = rng.choice(prefixes) + [
                    rng.randrange(1, 30000)
                    for _ in range(rng.randrange(1, 2 * BLOCK))]
                hit, _ = engine.add(f"q{i}", tokens)
                hits += hit > 0
            elif roll < 0.55 and done:
                engine.finish(rng.choice(done))
            elif roll < 0.62 and loading:
                engine.finish(rng.choice(loading))  # Aborted mid-load.
            elif roll < 0.72 and done:
                rid = rng.choice(done)
                engine.preempt(rid)
                engine.step()
                engine.resume(rid)
                verified.discard(rid)
            elif roll < 0.78 and not engine.requests:
                engine.update_weights()
                updates += 1
            engine.step()
            for rid, r in engine.requests.items():
                if r.state == "done" and rid not in verified:
                    assert engine.verify(rid, len(r.tokens)) == {0: [], 1: []}, (
                        seed, i, rid)
                    verified.add(rid)
                    checks += 1
            for w in engine.workers:
                w.call("wait", 5.0)
        # Every request ends: finished once computed (or while loading).
        def drained() -> bool:
            for rid in [rid for rid, r in engine.requests.items()
                        if r.state in ("done", "waiting_kv")]:
                engine.finish(rid)
            return not engine.requests
        engine.run_until(drained)
    finally:
        engine.close()
    assert checks >= 10 and hits >= 3 and updates >= 1, (checks, hits, updates)


def test_only_the_scheduler_connector_resets(socket_link):
    """vLLM calls reset_cache on the scheduler's connector; a worker's has
    no cache of its own to reset (None: not supported)."""
    from tierkv.vllm import KVConnectorRole, TierkvConnector
    worker = TierkvConnector(
        vllm_config({"socket": socket_link, "model": "",
                     "num_layers": LAYERS, "num_kv_heads": KV_HEADS,
                     "head_dim": HEAD_DIM, "block_size": BLOCK,
                     "dtype": "bf16", "tp_size": 1, "rank": 0}),
        KVConnectorRole.WORKER, SimpleNamespace(num_blocks=8))
    assert worker.reset_cache() is None
    worker.shutdown()


def test_preempted_request_loads_the_blocks_it_stored(engine):
    tokens = PREFIX + [4, 5, 6]
    assert engine.add("r1", tokens) == (0, False)
    engine.step()  # Computes and stores its four full blocks.
    engine.preempt("r1")
    engine.step()
    assert engine.resume("r1") == (64, True)
    engine.run_until(lambda: "r1" in engine.received)
    assert engine.verify("r1", 64) == {0: [], 1: []}
    engine.step()  # Scheduled as resumed: the three tokens after the hit.
    assert [c[1:] for c in engine.computed] == [(64, len(tokens))]
    assert engine.verify("r1", len(tokens)) == {0: [], 1: []}
    assert engine.finish("r1") is False  # Its blocks were stored before.


def test_a_request_is_offered_two_loads_at_most(engine):
    # vLLM looks a request up again after each preemption and after a load
    # that failed from its first block; a load that failed every time would
    # be offered forever. The third lookup computes instead.
    tokens = PREFIX + [4, 5, 6]
    _store_prefix(engine, "r0", tokens)
    # Lookups vLLM could not schedule (no free blocks yet) cost no load.
    for _ in range(3):
        assert engine.lookup("r1", tokens) == (64, True)
    for offer in (1, 2):
        look = engine.lookup if offer == 1 else engine.resume
        assert look("r1", *([tokens] if offer == 1 else [])) == (64, True)
        if offer == 1:
            engine.allocate("r1")
        engine.run_until(lambda: "r1" in engine.received)
        engine.received.discard("r1")
        engine.preempt("r1")
        engine.step()
    assert engine.resume("r1") == (0, False)
    engine.step()  # Computes every token, none loaded.
    assert [c[1:] for c in engine.computed] == [(0, len(tokens))]
    assert engine.verify("r1", len(tokens)) == {0: [], 1: []}
    assert engine.finish("r1") is False  # Its blocks were stored before.


def test_request_aborted_before_its_load_never_corrupts_reused_blocks(
        engine, daemon):
    _store_prefix(engine, "r1", PREFIX + [1])
    assert engine.add("r2", PREFIX + [2]) == (64, True)
    load_blocks = list(engine.requests["r2"].blocks)
    # Aborted before the step that hands its load to the workers: vLLM keeps
    # the blocks until the workers report the request received.
    assert engine.finish("r2") is False
    engine.run_until(lambda: "r2" in engine.received)
    assert "r2" not in engine.requests

    other = list(range(5000, 5000 + 3 * BLOCK))  # Misses: computed.
    assert engine.add("r3", other) == (0, False)
    assert set(engine.requests["r3"].blocks) & set(load_blocks)
    engine.step()
    assert engine.verify("r3", len(other)) == {0: [], 1: []}
    assert engine.finish("r3") is True
    engine.run_until(lambda: "r3" in engine.sent)
    assert _settled(_observer(daemon), 4)["host"]["pinned_slots"] == 0


def test_request_aborted_during_its_stores_frees_after_the_copies(
        engine, daemon):
    tokens = PREFIX + [3, 4]
    assert engine.add("r1", tokens) == (0, False)
    meta, compute, finished = engine.build()  # Holds r1's store events.
    assert engine.finish("r1") is True  # Aborted before the forward ran.
    assert engine.requests["r1"].state == "delayed"
    for w in engine.workers:
        w.send("step", meta, compute, finished)
    engine.collect([w.receive() for w in engine.workers])
    engine.run_until(lambda: "r1" in engine.sent)
    assert "r1" not in engine.requests

    assert engine.add("r2", PREFIX + [8]) == (64, True)
    engine.run_until(lambda: "r2" in engine.received)
    assert engine.verify("r2", 64) == {0: [], 1: []}


def test_lost_tierkvd_reports_load_errors_and_attaches_again(
        engine, daemon, socket_link, start_tierkvd):
    _store_prefix(engine, "r1", PREFIX + [1])
    assert engine.add("r2", PREFIX + [2]) == (64, True)
    meta, compute, finished = engine.build()  # r2's load, not yet copied.
    daemon.kill()
    for w in engine.workers:
        w.send("step", meta, compute, finished)
    engine.collect([w.receive() for w in engine.workers])
    engine.run_until(lambda: "r2" in engine.received)
    # No rank serves a block it did not load, unless vLLM is told.
    req = engine.requests["r2"]
    for rank, bad in engine.verify("r2", 64).items():
        assert all(req.blocks[i] in engine.load_errors for i in bad), rank

    restarted = start_tierkvd(layout=_layout())
    os.unlink(socket_link)
    os.symlink(restarted.socket, socket_link)
    engine.step()  # The scheduler attaches again; workers follow.
    assert engine.scheduler.tierkv_client.connected
    other = list(range(7000, 7000 + 2 * BLOCK))
    _store_prefix(engine, "r3", other + [1])
    assert engine.add("r4", other + [2]) == (32, True)
    engine.run_until(lambda: "r4" in engine.received)
    assert engine.verify("r4", 32) == {0: [], 1: []}


def test_a_tierkvd_that_refuses_the_reattach_leaves_vllm_running(
        daemon, socket_link, start_tierkvd, monkeypatch):
    # The scheduler's clock, which only the test moves.
    clock = [100.0]
    monkeypatch.setattr(tierkv.vllm, "time",
                        SimpleNamespace(monotonic=lambda: clock[0]))
    engine = Engine({"socket": socket_link, "model": "", "num_layers": LAYERS,
                     "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                     "block_size": BLOCK, "dtype": "bf16", "tp_size": 2})
    try:
        _store_prefix(engine, "r1", PREFIX + [1])
        daemon.kill()
        # Restarted serving another model: it refuses the scheduler.
        other = start_tierkvd(layout=_layout(), model="another/model")
        os.unlink(socket_link)
        os.symlink(other.socket, socket_link)
        observer = tierkv.Client.open(other.socket, _layout(), 1,
                                      model="another/model", name="observer")
        refusals = lambda: observer.stats()["attach"]["refused_mismatch"]
        assert engine.add("r2", PREFIX + [2]) == (0, False)  # Lost.
        engine.step()  # Refused: logged, and vLLM's step goes on.
        assert engine.scheduler.tierkv_client is None  # Lost, and closed.
        assert refusals() == 1
        # Tries again after 1 s, then 2 s, not at every step.
        for advance, tries in [(0.5, 1), (0.5, 2), (1.0, 2), (1.0, 3)]:
            clock[0] += advance
            engine.step()
            assert refusals() == tries, (advance, tries)
        # Requests run meanwhile, computed without tierkv.
        tokens = PREFIX + [3]
        assert engine.add("r3", tokens) == (0, False)
        engine.step()
        assert engine.verify("r3", len(tokens)) == {0: [], 1: []}
        assert engine.finish("r3") is False
    finally:
        engine.close()


def test_metadata_of_a_past_scheduler_epoch_is_never_started(
        engine, daemon, socket_link, start_tierkvd):
    _store_prefix(engine, "r1", PREFIX + [1])
    assert engine.add("r2", PREFIX + [2]) == (64, True)
    stale, compute, finished = engine.build()  # r2's load, epoch 1.
    daemon.kill()
    restarted = start_tierkvd(layout=_layout())
    os.unlink(socket_link)
    os.symlink(restarted.socket, socket_link)
    # The scheduler notices, attaches to the new tierkvd (epoch 2), and the
    # workers attach for epoch 2; worker and event ids start over there.
    engine.run_until(lambda: _attached(engine))
    other = list(range(7000, 7000 + 2 * BLOCK))
    _store_prefix(engine, "r3", other + [1])
    assert engine.add("r4", other + [2]) == (32, True)
    # Epoch 1's metadata arrives late: its load names an event id of the
    # old tierkvd, which the new one may have given to another event.
    for w in engine.workers:
        w.send("step", stale, compute, finished)
    engine.collect([w.receive() for w in engine.workers])
    assert "r2" in engine.received
    r2 = engine.requests["r2"]
    assert set(r2.blocks[:4]) <= engine.load_errors
    engine.run_until(lambda: "r4" in engine.received)
    assert engine.verify("r4", 32) == {0: [], 1: []}
    with _observer(restarted) as observer:
        stats = _settled(observer, 4)  # Scheduler, two ranks, observer.
        assert len(stats["workers"]) == 4
        assert stats["host"]["events_in_flight"] == 0


def test_a_worker_that_cannot_attach_fails_the_step_without_raising(
        daemon):
    extra = {"socket": daemon.socket, "num_layers": LAYERS,
             "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
             "block_size": BLOCK, "dtype": "bf16", "tp_size": 1, "rank": 0,
             "model": ""}
    worker = tierkv.vllm.TierkvConnector(vllm_config(extra),
                                         tierkv.vllm.KVConnectorRole.WORKER)
    worker.register_kv_caches(
        {f"layer.{l}": torch.zeros((2, 8, BLOCK, KV_HEADS, HEAD_DIM),
                                   dtype=torch.bfloat16)
         for l in range(LAYERS)})
    load = tierkv.TransferEvent("load", 1, 1, [2, 3], [1, 2])
    store = tierkv.TransferEvent("store", 2, 2, [4], [3])
    # No scheduler 999 in tierkvd: Client.open raises NotFoundError.
    worker.bind_connector_metadata(tierkv.vllm.TierkvConnectorMetadata(
        scheduler=999, session=1, epoch="gone",
        loads=[tierkv.vllm.LoadOp("a", load, epoch="gone")],
        stores=[tierkv.vllm.StoreOp("b", store, epoch="gone")]))
    worker.start_load_kv(None)
    worker.wait_for_save()
    assert worker.tierkv_client is None
    assert worker.get_block_ids_with_load_errors() == {2, 3}
    assert worker.get_finished({"b"}) == (None, {"a"})
    worker.shutdown()


class _InProcessTp:
    """The scheduler and two ranks' connectors in this process (so a test
    can make one rank's attach fail, or drop its client), stepped in vLLM's
    order."""

    def __init__(self, daemon, **extra) -> None:
        self.extra = {"socket": daemon.socket, "model": "",
                      "num_layers": LAYERS, "num_kv_heads": KV_HEADS,
                      "head_dim": HEAD_DIM, "block_size": BLOCK,
                      "dtype": "bf16", "tp_size": 2, "num_device_blocks": 16,
                      "reconnect_wait": 0, **extra}
        role = tierkv.vllm.KVConnectorRole
        self.sched = tierkv.vllm.TierkvConnector(
            vllm_config(self.extra), role.SCHEDULER,
            SimpleNamespace(num_blocks=16))
        self.ranks = [self.rank(r) for r in range(2)]

    def rank(self, r: int):
        rank = tierkv.vllm.TierkvConnector(
            vllm_config(dict(self.extra, rank=r)),
            tierkv.vllm.KVConnectorRole.WORKER)
        rank.register_kv_caches(
            {f"layer.{l}": torch.zeros((2, 16, BLOCK, KV_HEADS // 2,
                                        HEAD_DIM), dtype=torch.bfloat16)
             for l in range(LAYERS)})
        return rank

    def step(self, new=(), computed=None):
        cached = SimpleNamespace(req_ids=[], new_block_ids=[],
                                 num_computed_tokens=[], resumed_req_ids=set())
        meta = self.sched.build_connector_meta(SimpleNamespace(
            scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
            num_scheduled_tokens=computed or {}, finished_req_ids=set()))
        for rank in self.ranks:
            rank.bind_connector_metadata(meta)
            rank.start_load_kv(None)
            rank.wait_for_save()
            rank.get_finished(set())
            rank.clear_connector_metadata()

    def store(self, rid: str, first: int) -> None:
        """A request computing three blocks of new tokens, and finished."""
        tokens = list(range(first, first + 3 * BLOCK)) + [1]
        request = SimpleNamespace(request_id=rid, all_token_ids=tokens)
        assert self.sched.get_num_new_matched_tokens(request, 0) == (0, False)
        blocks = list(range(1, 5))
        self.sched.update_state_after_alloc(
            request, SimpleNamespace(get_block_ids=lambda: (blocks,)), 0)
        self.step([SimpleNamespace(req_id=rid, block_ids=(blocks,),
                                   num_computed_tokens=0)],
                  {rid: len(tokens)})
        self.sched.request_finished(request, blocks)

    def shutdown(self) -> None:
        for connector in [self.sched] + self.ranks:
            connector.shutdown()


def test_a_rank_that_failed_to_attach_attaches_later_in_the_epoch(
        daemon, monkeypatch, caplog):
    real_open = tierkv.Client.open
    failures = []

    def open_failing_rank1_once(*args, **kwargs):
        if kwargs.get("rank") == 1 and not failures:
            failures.append(1)
            raise tierkv.DeadlineExceededError("tierkvd did not answer")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(tierkv.Client, "open",
                        staticmethod(open_failing_rank1_once))
    tp = _InProcessTp(daemon)
    observer = _observer(daemon)
    tp.store("r1", 1000)  # Rank 1 could not attach: it copies none of it.
    assert failures and tp.ranks[1].tierkv_client is None
    tp.step()  # Rank 1 attaches, and declines the store it missed.
    assert tp.ranks[1].tierkv_client is not None
    stats = _settled(observer, workers=4)
    assert stats["host"]["events_in_flight"] == 0
    assert stats["host"]["pinned_slots"] == 0
    assert stats["host"]["cached_slots"] == 0  # Half a store is never kept.
    tp.store("r2", 1000)  # Both ranks copy it now.
    stats = _settled(observer, workers=4)
    assert stats["host"]["cached_slots"] == 3
    # Metadata naming the scheduler's id with another epoch (an earlier
    # attachment's; after a restart, another engine's): tierkvd refuses the
    # rank before it registers.
    tp.ranks[1].shutdown()
    _settled(observer, workers=3)
    stray = tp.rank(1)
    with caplog.at_level("WARNING", logger="tierkv.vllm"):
        stray.bind_connector_metadata(tierkv.vllm.TierkvConnectorMetadata(
            scheduler=tp.sched.tierkv_client.worker_id, session=1,
            epoch="an-earlier-epoch"))
        stray.start_load_kv(None)
    assert stray.tierkv_client is None
    assert "another tag" in caplog.text
    assert len(observer.stats()["workers"]) == 3
    tp.ranks[1] = stray
    tp.shutdown()


def test_a_lost_rank_ends_the_epoch_and_the_next_one_copies_again(
        daemon, caplog):
    tp = _InProcessTp(daemon)
    observer = _observer(daemon)
    tp.store("r1", 1000)
    assert _settled(observer, workers=4)["host"]["cached_slots"] == 3
    first_epoch = tp.sched._scheduler._epoch
    # A store is handed out; before the ranks see its metadata, rank 1's
    # attachment is lost (its socket closed) and tierkvd drops it, failing
    # its part of what is in flight.
    tokens = list(range(2000, 2000 + 3 * BLOCK)) + [1]
    request = SimpleNamespace(request_id="r2", all_token_ids=tokens)
    assert tp.sched.get_num_new_matched_tokens(request, 0) == (0, False)
    blocks = list(range(1, 5))
    tp.sched.update_state_after_alloc(
        request, SimpleNamespace(get_block_ids=lambda: (blocks,)), 0)
    cached = SimpleNamespace(req_ids=[], new_block_ids=[],
                             num_computed_tokens=[], resumed_req_ids=set())
    meta = tp.sched.build_connector_meta(SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="r2", block_ids=(blocks,),
                                            num_computed_tokens=0)],
        scheduled_cached_reqs=cached, num_scheduled_tokens={"r2": 49},
        finished_req_ids=set()))
    assert len(meta.stores) == 1
    tp.ranks[1].tierkv_client.close()
    _settled(observer, workers=3)
    with caplog.at_level("WARNING", logger="tierkv.vllm"):
        for rank in tp.ranks:
            rank.bind_connector_metadata(meta)
            rank.start_load_kv(None)
            rank.wait_for_save()
            rank.clear_connector_metadata()
        # Rank 1 does not attach again for the epoch, nor copy the store.
        assert tp.ranks[1].tierkv_client is None
        assert "rank 1 lost its attachment" in caplog.text
        stats = _settled(observer, workers=3)
        assert stats["host"]["events_in_flight"] == 0
        assert stats["host"]["pinned_slots"] == 0
        assert stats["host"]["cached_slots"] == 3  # Half a store: not kept.
        # The epoch hands out nothing more: the scheduler's next lookup is
        # refused, naming the lost rank, and it attaches anew.
        tp.store("r3", 3000)
    assert "lost rank 1" in caplog.text
    assert tp.sched._scheduler._epoch != first_epoch
    # Both ranks attach for the new epoch, and copy its stores.
    tp.store("r4", 4000)
    stats = _settled(observer, workers=4)
    assert stats["host"]["events_in_flight"] == 0
    assert stats["host"]["cached_slots"] == 6
    tp.shutdown()


def test_a_torch_copy_that_fails_is_reported_not_raised(daemon, monkeypatch,
                                                        caplog):
    from tierkv._torch_copy import TorchCopier
    tp = _InProcessTp(daemon, copy_engine="torch")
    observer = _observer(daemon)
    real_store = TorchCopier.store

    def failing_on_rank1(self, client, event):
        if self is tp.ranks[1]._worker._copier:
            raise RuntimeError("CUDA error: an illegal memory access")
        real_store(self, client, event)

    monkeypatch.setattr(TorchCopier, "store", failing_on_rank1)
    with caplog.at_level("WARNING", logger="tierkv.vllm"):
        tp.store("r1", 1000)  # Neither raises into vLLM's step.
    assert "illegal memory access" in caplog.text
    stats = _settled(observer, workers=4)
    assert stats["host"]["events_in_flight"] == 0
    assert stats["host"]["pinned_slots"] == 0
    assert stats["host"]["cached_slots"] == 0  # Half a store: never kept.
    monkeypatch.setattr(TorchCopier, "store", real_store)
    tp.store("r2", 2000)
    assert _settled(observer, workers=4)["host"]["cached_slots"] == 3
    tp.shutdown()


def test_wait_for_save_outwaits_its_timeout_until_the_stores_are_copied(
        socket_link):
    e = Engine({"socket": socket_link, "model": "", "num_layers": LAYERS,
                "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                "block_size": BLOCK, "dtype": "bf16", "tp_size": 2,
                "call_timeout": 5.0, "save_timeout": 0.0001})
    try:
        assert e.add("r1", PREFIX + [1]) == (0, False)
        e.step()  # Each rank's wait_for_save runs past save_timeout.
        # vLLM may write the blocks again now: no store still reads them.
        assert [w.call("stores_copying") for w in e.workers] == [0, 0]
        assert e.finish("r1") is True
        e.run_until(lambda: "r1" in e.sent)
        assert e.add("r2", PREFIX + [2]) == (64, True)
        e.run_until(lambda: "r2" in e.received)
        assert e.verify("r2", 64) == {0: [], 1: []}
    finally:
        e.close()


def test_tierkvd_lost_before_allocation_fails_the_whole_load(
        engine, daemon):
    _store_prefix(engine, "r1", PREFIX + [1])
    assert engine.lookup("r2", PREFIX + [2]) == (64, True)
    daemon.kill()
    engine.allocate("r2")  # tierkvd is gone: the load never starts.
    blocks = list(engine.requests["r2"].blocks)
    engine.run_until(lambda: "r2" in engine.received)
    assert engine.load_errors == set(blocks)
    engine.step()  # vLLM recomputes the whole prompt.
    assert [c[1:] for c in engine.computed] == [(0, len(PREFIX) + 1)]
    assert engine.verify("r2", len(PREFIX) + 1) == {0: [], 1: []}


def test_a_failed_allocation_finishes_its_request_in_tierkvd(engine, daemon):
    _store_prefix(engine, "r1", PREFIX + [1])
    assert engine.lookup("r2", PREFIX + [2]) == (64, True)
    side = engine.scheduler._scheduler
    tid = side._requests["r2"].tid
    # tierkvd no longer knows the request (as after a refused lookup): its
    # allocation fails, the load with it, and nothing of it is kept.
    engine.scheduler.tierkv_client.finish(tid)
    engine.allocate("r2")
    assert tid not in side._by_tid
    assert side._requests["r2"].tid is None
    engine.run_until(lambda: "r2" in engine.received)
    # The blocks the load was to fill: the 64 tokens of the hit.
    assert engine.load_errors == set(list(engine.requests["r2"].blocks)[:4])
    engine.step()
    assert engine.finish("r2") is False
    assert _observer(daemon).stats()["host"]["pinned_slots"] == 0


def test_worker_killed_mid_load_releases_slots_and_a_new_rank_serves(
        engine, daemon):
    _store_prefix(engine, "r1", PREFIX + [1])
    observer = _observer(daemon)
    assert engine.add("r2", PREFIX + [2]) == (64, True)
    meta, compute, finished = engine.build()
    engine.workers[1].call("start_only", meta)  # Its copy started...
    engine.workers[1].kill()  # ...and it dies before completing it.
    engine.workers[0].send("step", meta, compute, finished)
    engine.collect([engine.workers[0].receive(), (set(), set(), set())])
    _settled(observer, workers=3)  # tierkvd dropped rank 1.
    first_epoch = engine.scheduler._scheduler._epoch
    engine.replace_worker(1)
    # Rank 1's KV of r2 is gone with it: the engine aborts the request.
    assert engine.finish("r2") is False
    engine.run_until(lambda: "r2" in engine.received)
    # Losing rank 1 ended the scheduler's attachment: at its next call it
    # attaches anew, and both ranks attach for the new epoch.
    engine.run_until(lambda: engine.scheduler._scheduler._epoch not in (
        "", first_epoch))

    stats = _settled(observer, workers=4)
    assert stats["host"]["pinned_slots"] == 0
    assert stats["host"]["cached_slots"] == 4

    tokens = PREFIX + [6]
    assert engine.add("r3", tokens) == (64, True)
    engine.run_until(lambda: "r3" in engine.received)
    assert engine.load_errors == set()
    assert engine.verify("r3", 64) == {0: [], 1: []}


def _admin(daemon, *args: str) -> str:
    admin = os.path.join(os.path.dirname(os.environ.get(
        "TIERKV_TIERKVD", daemon.process.args[0])), "tierkv-admin")
    return subprocess.run([admin, *args, "--socket", daemon.socket],
                          check=True, capture_output=True,
                          text=True).stdout


def _prefix_on_disk(start_tierkvd, tmp_path, **extra):
    """A tierkvd of eight host slots spilling to disk past half of them,
    every unpinned block then, an engine on it, and an observer; PREFIX
    stored (request r1) and then spilled to disk with another prompt's
    blocks (r2), and more prompts' when one of PREFIX's blocks was pinned
    as the spill ran (under load, now and then one stayed on host)."""
    daemon = start_tierkvd(
        layout=_layout(), host_bytes=9 * _layout().block_bytes,
        disk_dir=str(tmp_path / "disk"),
        extra_args=("--disk-capacity", "64M", "--spill-high", "0.5",
                    "--spill-low", "0.01"))
    engine = Engine({"socket": daemon.socket, "model": "",
                     "num_layers": LAYERS, "num_kv_heads": KV_HEADS,
                     "head_dim": HEAD_DIM, "block_size": BLOCK,
                     "dtype": "bf16", "tp_size": 2, **extra})
    def prefix_on_disk() -> bool:
        # Asked without a lookup, which would pin and renew the blocks.
        route = json.loads(_admin(daemon, "route", "--json",
                                  *map(str, PREFIX + [2])))["nodes"][0]
        return route["lower_tokens"] == route["cached_tokens"] == len(PREFIX)

    try:
        observer = _observer(daemon)
        _store_prefix(engine, "r1", PREFIX + [1])
        _store_prefix(engine, "r2", list(range(3000, 3000 + 64)) + [1])
        observer.wait_idle(20.0)  # r1's blocks, the oldest, spilled.
        # A block of PREFIX still pinned when the spill ran stays on host,
        # below the watermark: another prompt's blocks push it down.
        for i in range(5):
            if prefix_on_disk():
                break
            first = 4000 + 100 * i
            _store_prefix(engine, f"push{i}",
                          list(range(first, first + 64)) + [1])
            observer.wait_idle(20.0)
        assert prefix_on_disk()
    except BaseException:
        engine.close()
        raise
    return daemon, engine, observer


def test_load_cut_short_by_a_failed_promotion_names_its_blocks(
        start_tierkvd, tmp_path):
    daemon, engine, observer = _prefix_on_disk(start_tierkvd, tmp_path)
    try:
        probe = observer.lookup(1, PREFIX + [2])
        observer.finish(1)
        assert (probe.hit_tokens, probe.disk_hit_tokens) == (64, 64)
        # The third block leaves the disk between lookup and allocation.
        keys = [line.split()[0] for line in
                _admin(daemon, "keys", *map(str, PREFIX)).splitlines()
                if line.strip()]
        assert engine.lookup("r3", PREFIX + [2]) == (64, True)
        _admin(daemon, "evict", keys[2])
        engine.allocate("r3")  # Its load waits for the promotions.
        blocks = engine.requests["r3"].blocks
        observer.wait_idle(20.0)  # They are done (one failed).
        engine.run_until(lambda: "r3" in engine.received)
        assert engine.load_errors == set(blocks[2:4])
        assert engine.verify("r3", 2 * BLOCK) == {0: [], 1: []}
        engine.step()  # Recomputes from the first failed block.
        assert [c[1:] for c in engine.computed] == [(2 * BLOCK,
                                                     len(PREFIX) + 1)]
        assert engine.verify("r3", len(PREFIX) + 1) == {0: [], 1: []}
    finally:
        engine.close()


class _ClientProxy:
    """A tierkv client standing in for the scheduler's: what a subclass
    does not define goes to the client."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)


class _NoReadyLoads(_ClientProxy):
    """The scheduler's client, never handed a ready load: promotions from a
    lower tier that stopped answering."""

    def take_ready_loads(self):
        return []


def _load_waiting_for_promotions(engine: Engine) -> tuple:
    """Request r3 hits PREFIX on disk and its load waits for promotions that
    never come (_NoReadyLoads) through one step; the scheduler side and the
    load's four device blocks."""
    side = engine.scheduler._scheduler
    side._client = _NoReadyLoads(side._client)
    assert engine.add("r3", PREFIX + [2]) == (64, True)
    blocks = list(engine.requests["r3"].blocks)
    engine.step()
    return side, blocks


def test_a_load_that_waits_too_long_for_promotions_is_given_up(
        start_tierkvd, tmp_path, monkeypatch):
    """A load whose promotions never come (a disk that stopped answering:
    here tierkvd's ready loads are hidden from the scheduler) is given up
    after load_timeout: finished in tierkvd and reported failed, so vLLM
    computes the request's tokens instead of waiting for ever."""
    daemon, engine, observer = _prefix_on_disk(start_tierkvd, tmp_path,
                                               load_timeout=30)
    clock = [1000.0]
    monkeypatch.setattr(tierkv.vllm, "time",
                        SimpleNamespace(monotonic=lambda: clock[0]))

    try:
        side, blocks = _load_waiting_for_promotions(engine)
        clock[0] += 29
        engine.step()
        assert "r3" not in engine.received  # Still waiting.
        clock[0] += 2
        engine.run_until(lambda: "r3" in engine.received)
        assert engine.load_errors == set(blocks)
        side._client = side._client._client
        engine.step()  # Computes every token.
        assert [c[1:] for c in engine.computed] == [(0, len(PREFIX) + 1)]
        assert engine.verify("r3", len(PREFIX) + 1) == {0: [], 1: []}
        stats = _settled(observer, workers=4)
        assert stats["host"]["pinned_slots"] == 0
    finally:
        engine.close()


def test_a_load_waiting_for_promotions_at_a_reset_is_given_up(
        start_tierkvd, tmp_path):
    """A load still waiting for its promotions from disk when the cache is
    reset would bring the old weights' KV in after the reset: it is given
    up (reported failed), and the request computes its tokens."""
    daemon, engine, observer = _prefix_on_disk(start_tierkvd, tmp_path)

    try:
        side, blocks = _load_waiting_for_promotions(engine)
        assert "r3" not in engine.received  # Waiting for promotions.
        assert engine.scheduler.reset_cache() is True
        side._client = side._client._client
        engine.run_until(lambda: "r3" in engine.received)
        assert engine.load_errors == set(blocks)
        engine.step()  # Computes every token.
        assert [c[1:] for c in engine.computed] == [(0, len(PREFIX) + 1)]
        assert engine.verify("r3", len(PREFIX) + 1) == {0: [], 1: []}
        stats = _settled(observer, workers=4)
        assert stats["host"]["pinned_slots"] == 0
        assert stats["host"]["loads_completed"] == 0
    finally:
        engine.close()


def test_a_generation_salt_has_one_length_whatever_the_salt():
    """A user's salt near tierkvd's string limit still fits once mixed
    with a generation; and the generation, not just the salt, tells keys
    apart."""
    from tierkv.vllm import _generation_salt
    long_salt = "s" * 4090
    assert len(_generation_salt("a" * 32, long_salt)) == 64
    assert len(_generation_salt("a" * 32, None)) == 64
    assert (_generation_salt("a" * 32, "x") !=
            _generation_salt("b" * 32, "x") != _generation_salt("a" * 32, ""))


class _CountingClient(_ClientProxy):
    """The scheduler's client, counting its commits; with `skipping`, each
    commit's result says a block was skipped (a cap)."""

    def __init__(self, client, skipping: bool = False) -> None:
        super().__init__(client)
        self.commits = 0
        self.skipping = skipping

    def commit(self, *args, **kwargs):
        self.commits += 1
        result = self._client.commit(*args, **kwargs)
        if self.skipping:
            return SimpleNamespace(stores=result.stores, skipped_blocks=1)
        return result


@pytest.mark.parametrize("skipping", [False, True])
def test_decode_steps_make_no_commit_round_trips(engine, skipping):
    """A step that completes no block of the tokens a request was looked up
    with has nothing to store: no commit is sent (one round trip per
    running request per step on vLLM's scheduling path). Blocks a commit
    skipped are not stored by a later one either (tierkvd goes on from the
    blocks it covered), so they change nothing."""
    tokens = PREFIX + [5, 6, 7]  # Four full blocks and three tokens.
    assert engine.add("r1", tokens) == (0, False)
    side = engine.scheduler._scheduler
    counting = _CountingClient(side._client, skipping)
    side._client = counting
    try:
        engine.step()  # The prefill: its four blocks are committed.
        assert counting.commits == 1
        for step in range(2 * BLOCK):  # Decode steps, a token each.
            engine.scheduler.build_connector_meta(SimpleNamespace(
                scheduled_new_reqs=[],
                scheduled_cached_reqs=SimpleNamespace(
                    req_ids=["r1"], new_block_ids=[None],
                    num_computed_tokens=[len(tokens) + step],
                    resumed_req_ids=set()),
                num_scheduled_tokens={"r1": 1}))
        assert counting.commits == 1
    finally:
        side._client = counting._client
    assert engine.finish("r1") is True
    engine.run_until(lambda: "r1" in engine.sent)


def test_the_connector_is_a_best_effort_cache_to_vllm(engine):
    """vLLM recomputes a preempted request whose connector requires
    delivery (its default for kv_both): tierkv's does not."""
    assert engine.scheduler.requires_kv_delivery is False
