"""tierkv.sglang's HiCache backend against a real tierkvd: pages set from
one host KV pool come back, byte for byte, into another, in each of SGLang's
MHA host pool layouts; tensor-parallel ranks never see each other's pages;
failures raise."""

from __future__ import annotations

import enum
import os
from types import SimpleNamespace

import pytest
import torch

import tierkv
import tierkv.sglang
from tierkv.sglang import TierkvStorage

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 32, 8


class HostPool:
    """SGLang's MHATokenToKVPoolHost, as the backend reads it."""

    def __init__(self, layout: str, pages: int = 16, heads: int = HEADS,
                 page_size: int = PAGE) -> None:
        self.layout, self.page_size, self.page_num = layout, page_size, pages
        self.layer_num, self.head_num, self.head_dim = LAYERS, heads, HEAD_DIM
        self.size = pages * page_size
        self.dtype = torch.bfloat16
        dims = {
            "layer_first": (2, LAYERS, self.size, heads, HEAD_DIM),
            "page_first": (2, self.size, LAYERS, heads, HEAD_DIM),
            "page_first_direct": (2, pages, LAYERS, page_size, heads,
                                  HEAD_DIM),
        }[layout]
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)

    def _token(self, plane: int, layer: int, token: int) -> torch.Tensor:
        b = self.kv_buffer
        if self.layout == "layer_first":
            return b[plane, layer, token]
        if self.layout == "page_first":
            return b[plane, token, layer]
        return b[plane, token // self.page_size, layer, token % self.page_size]

    def page(self, p: int) -> torch.Tensor:
        """Page p's K and V of every layer: [2, layers, page, heads, dim]."""
        return torch.stack([torch.stack([torch.stack(
            [self._token(plane, l, p * self.page_size + t)
             for t in range(self.page_size)]) for l in range(LAYERS)])
            for plane in (0, 1)])

    def fill(self, p: int, seed: int) -> None:
        for plane in (0, 1):
            for l in range(LAYERS):
                for t in range(self.page_size):
                    v = torch.arange(self.head_num * HEAD_DIM).view(
                        self.head_num, HEAD_DIM)
                    v = (v * 3 + seed * 11 + plane * 5 + l * 7 + t) % 201
                    self._token(plane, l, p * self.page_size + t).copy_(
                        (v - 100).to(self.dtype))


def _indices(pages: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE)
                      for p in pages]).to(torch.int64)


def _storage(socket: str, rank: int = 0, size: int = 1, cp_rank: int = 0,
             cp_size: int = 1, sglang_defaults: bool = False,
             **extra) -> TierkvStorage:
    if not sglang_defaults and "batch_timeout" not in extra:
        # Promotions from disk on a loaded test machine may take longer than
        # SGLang's prefetch timeout, the default.
        extra.setdefault("get_timeout_base", 60)
    config = SimpleNamespace(
        tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1,
        attn_cp_rank=cp_rank, attn_cp_size=cp_size,
        is_mla_model=False, is_page_first_layout=False, model_name=None,
        extra_config={"backend_name": "tierkv",
                      "module_path": "tierkv.sglang",
                      "class_name": "TierkvStorage", "interface_v1": 1,
                      "socket": socket, **extra})
    return TierkvStorage(config, {})


@pytest.fixture
def daemon(start_tierkvd):
    # One rank's layout: a TP rank's host pool holds HEADS heads.
    return start_tierkvd(layout=tierkv.KvLayout(
        LAYERS, HEADS, HEAD_DIM, block_size=PAGE, dtype="bf16"))


@pytest.mark.parametrize("layout",
                         ["layer_first", "page_first", "page_first_direct"])
def test_pages_set_from_one_pool_come_back_into_another(daemon, layout):
    src_pool, dst_pool = HostPool(layout), HostPool(layout)
    for p in range(5):
        src_pool.fill(p, seed=p + 1)
    keys = [f"page-hash-{i}" for i in range(5)]
    writer = _storage(daemon.socket)
    writer.register_mem_pool_host(src_pool)
    assert writer.batch_set_v1(keys, _indices([0, 1, 2, 3, 4])) == [True] * 5

    assert writer.batch_exists(keys) == 5
    # The leading run of hits only.
    assert writer.batch_exists(keys[:2] + ["never-set"] + keys[2:]) == 2
    assert writer.batch_exists(["never-set"] + keys) == 0
    assert writer.exists(keys[4]) and not writer.exists("never-set")

    reader = _storage(daemon.socket)
    reader.register_mem_pool_host(dst_pool)
    got = reader.batch_get_v1([keys[3], "never-set", keys[1]],
                              _indices([7, 2, 5]))
    assert got == [True, False, True]
    assert torch.equal(dst_pool.page(7), src_pool.page(3))
    assert torch.equal(dst_pool.page(5), src_pool.page(1))
    assert torch.count_nonzero(dst_pool.page(2)) == 0  # Left alone.
    # Setting pages tierkvd holds already succeeds without a copy.
    assert reader.batch_set_v1(keys[:2], _indices([9, 10])) == [True, True]
    stats = reader.client.stats()
    assert stats["host"]["stores_completed"] == 5
    assert stats["host"]["pinned_slots"] == 0
    writer.close()
    reader.close()


def _pages_on_disk(start_tierkvd, tmp_path, name: str, seed: int):
    """A tierkvd of eight host slots that spills past half of them, and a
    backend that set eight pages (pages 0..7 of its pool) through it, most
    of them spilled to disk: (daemon, writer, its pool, the keys)."""
    layout = tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                             dtype="bf16")
    daemon = start_tierkvd(
        layout=layout, host_bytes=9 * layout.block_bytes,
        disk_dir=str(tmp_path / "disk"),
        extra_args=("--disk-capacity", "64M", "--spill-high", "0.5",
                    "--spill-low", "0.25"))
    src_pool = HostPool("page_first")
    for p in range(8):
        src_pool.fill(p, seed=seed + p)
    keys = [f"{name}-{i}" for i in range(8)]
    writer = _storage(daemon.socket)
    writer.register_mem_pool_host(src_pool)
    # Four at a time: a worker pins at most its share of the host slots.
    for first in (0, 4):
        assert writer.batch_set_v1(keys[first:first + 4], _indices(
            list(range(first, first + 4)))) == [True] * 4
        writer.client.wait_idle(20.0)  # Spilled down to two host slots.
    return daemon, writer, src_pool, keys


def test_pages_spilled_to_disk_come_back_through_promotions(
        start_tierkvd, tmp_path):
    daemon, writer, src_pool, keys = _pages_on_disk(
        start_tierkvd, tmp_path, "spilled", 20)
    dst_pool = HostPool("page_first")
    assert writer.batch_exists(keys) == 8

    reader = _storage(daemon.socket)
    reader.register_mem_pool_host(dst_pool)
    pages = list(range(8, 16))
    for first in (0, 4):
        assert reader.batch_get_v1(keys[first:first + 4], _indices(
            pages[first:first + 4])) == [True] * 4
    for src, dst in zip(range(8), pages):
        assert torch.equal(dst_pool.page(dst), src_pool.page(src)), src
    stats = reader.client.stats()
    assert stats["host"]["promotions"] > 0
    assert stats["host"]["pinned_slots"] == 0


def test_a_late_get_is_a_miss_and_leaves_no_copy_running(
        start_tierkvd, tmp_path, caplog):
    daemon, writer, src_pool, keys = _pages_on_disk(
        start_tierkvd, tmp_path, "late", 60)
    dst_pool = HostPool("page_first")

    # By default a get waits as long as SGLang waits for a prefetch of its
    # tokens (1 s + 0.25 s per 1024); sets, and gets given only
    # batch_timeout, wait batch_timeout.
    defaults = _storage(daemon.socket, sglang_defaults=True)
    defaults.register_mem_pool_host(HostPool("page_first"))
    assert defaults._get_timeout(4) == pytest.approx(1.0 + 0.25 * 4 * PAGE
                                                     / 1024)
    assert defaults._get_timeout(512) == pytest.approx(2.0)
    defaults.close()
    assert _storage(daemon.socket, batch_timeout=7)._get_timeout(512) == 7
    tuned = _storage(daemon.socket, batch_timeout=7, get_timeout_base=0.5,
                     get_timeout_per_ki_token=1)
    tuned.register_mem_pool_host(HostPool("page_first"))
    assert tuned._get_timeout(128) == pytest.approx(0.5 + 128 * PAGE / 1024)
    tuned.close()
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="get_timeout_base"):
            _storage(daemon.socket, get_timeout_base=bad)

    # No time at all: every page whose copy had not finished is a miss
    # (those on disk wait for promotions, cancelled), logged; none of its
    # copies runs once the call returns, and nothing stays pinned.
    hurried = _storage(daemon.socket, get_timeout_base=0,
                       get_timeout_per_ki_token=0)
    hurried.register_mem_pool_host(HostPool("page_first"))
    with caplog.at_level("WARNING", logger="tierkv.sglang"):
        got = hurried.batch_get_v1(keys[:4], _indices([8, 9, 10, 11]))
    assert got == [False] * 4
    assert hurried.client.transfers_in_flight == 0
    assert hurried.client.loads_pending == 0
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "tierkv.sglang"]
    assert len(warnings) == 1 and "batch_get_v1" in warnings[0]
    assert "counted as misses" in warnings[0]
    hurried.client.wait_idle(20.0)
    assert hurried.client.stats()["host"]["pinned_slots"] == 0
    # Given the time, the same pages come whole.
    reader = _storage(daemon.socket)
    reader.register_mem_pool_host(dst_pool)
    for first in (0, 4):
        assert reader.batch_get_v1(keys[first:first + 4], _indices(
            list(range(8 + first, 12 + first)))) == [True] * 4
    for src in range(8):
        assert torch.equal(dst_pool.page(8 + src), src_pool.page(src)), src
    for backend in (writer, reader, hurried):
        backend.close()


def test_a_batch_past_the_event_cap_keeps_the_loads_it_started(
        start_tierkvd):
    daemon = start_tierkvd(
        layout=tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                               dtype="bf16"),
        extra_args=("--max-events-per-worker", "2"))
    src_pool, dst_pool = HostPool("page_first"), HostPool("page_first")
    for p in range(4):
        src_pool.fill(p, seed=40 + p)
    keys = [f"capped-{i}" for i in range(4)]
    writer = _storage(daemon.socket)
    writer.register_mem_pool_host(src_pool)
    for first in (0, 2):
        assert writer.batch_set_v1(keys[first:first + 2], _indices(
            [first, first + 1])) == [True, True]
    reader = _storage(daemon.socket)
    reader.register_mem_pool_host(dst_pool)
    # Two loads in flight at once is the cap: the rest are misses, and the
    # two started are whole.
    got = reader.batch_get_v1(keys, _indices([4, 5, 6, 7]))
    assert got == [True, True, False, False]
    assert torch.equal(dst_pool.page(4), src_pool.page(0))
    assert torch.equal(dst_pool.page(5), src_pool.page(1))
    stats = reader.client.stats()
    assert stats["host"]["quota_event_refusals"] == 2
    assert stats["host"]["pinned_slots"] == 0
    # Next time the rest come too.
    assert reader.batch_get_v1(keys[2:], _indices([6, 7])) == [True, True]
    writer.close()
    reader.close()


def test_tensor_parallel_ranks_keep_their_own_pages(daemon):
    # tierkvd's layout is one rank's: HEADS heads of each rank's shard.
    pools = [HostPool("layer_first"), HostPool("layer_first")]
    ranks = [_storage(daemon.socket, r, 2) for r in range(2)]
    for r, (pool, backend) in enumerate(zip(pools, ranks)):
        pool.fill(0, seed=10 + r)
        backend.register_mem_pool_host(pool)
    assert ranks[0].batch_set_v1(["shared-key"], _indices([0])) == [True]
    assert ranks[1].batch_exists(["shared-key"]) == 0
    assert ranks[1].batch_set_v1(["shared-key"], _indices([0])) == [True]
    for r, (pool, backend) in enumerate(zip(pools, ranks)):
        assert backend.batch_get_v1(["shared-key"], _indices([3])) == [True]
        assert torch.equal(pool.page(3), pool.page(0)), r
    assert not torch.equal(pools[0].page(3), pools[1].page(3))


def test_failures_raise_and_never_return_none(daemon, caplog):
    backend = _storage(daemon.socket)
    with pytest.raises(tierkv.FailedPreconditionError,
                       match="register_mem_pool_host"):
        backend.batch_get_v1(["k"], _indices([0]))
    with pytest.raises(ValueError, match="page-size"):
        backend.register_mem_pool_host(HostPool("layer_first", page_size=2))
    with pytest.raises(NotImplementedError, match="interface_v1"):
        backend.get("k")

    pool = HostPool("page_first")
    pool.fill(0, seed=3)
    backend.register_mem_pool_host(pool)
    assert backend.batch_set_v1(["k"], _indices([0])) == [True]
    # A page past the pool fails the batch after the first load started:
    # the call returns only once that copy is done (SGLang reuses the page
    # at once), and nothing stays pinned.
    with pytest.raises(tierkv.OutOfRangeError, match="device block 99"):
        backend.batch_get_v1(["k", "k"], _indices([1, 99]))
    assert backend.client.transfers_in_flight == 0
    assert torch.equal(pool.page(1), pool.page(0))
    assert backend.client.stats()["host"]["pinned_slots"] == 0
    pool.fill(3, seed=4)
    with pytest.raises(tierkv.OutOfRangeError, match="device block 99"):
        backend.batch_set_v1(["k3", "k99"], _indices([3, 99]))
    assert backend.client.transfers_in_flight == 0
    assert backend.batch_get_v1(["k"], _indices([2])) == [True]
    assert torch.equal(pool.page(2), pool.page(0))
    assert backend.client.stats()["host"]["pinned_slots"] == 0
    # tierkvd gone: misses and nothing stored, not exceptions, which would
    # stop HiCache's prefetch and backup threads for good; logged once.
    daemon.kill()
    with caplog.at_level("WARNING", logger="tierkv.sglang"):
        assert backend.batch_exists(["k"]) == 0
        assert backend.batch_get_v1(["k"], _indices([1])) == [False]
        assert backend.batch_set_v1(["k", "k2"], _indices([1, 2])) == [False,
                                                                     False]
    warnings = [r for r in caplog.records if r.name == "tierkv.sglang"]
    assert len(warnings) == 1
    assert "batch_exists" in warnings[0].getMessage()
    with pytest.raises(ValueError, match="MLA"):
        TierkvStorage(SimpleNamespace(is_mla_model=True, extra_config={}),
                      {})


def test_backend_attaches_to_a_restarted_tierkvd(daemon, start_tierkvd,
                                                 tmp_path):
    # The backend's socket path: a link to the tierkvd serving now.
    link = str(tmp_path / "tierkvd.sock")
    os.symlink(daemon.socket, link)
    pool = HostPool("layer_first")
    pool.fill(0, seed=5)
    backend = _storage(link)
    backend.register_mem_pool_host(pool)
    assert backend.batch_set_v1(["k"], _indices([0])) == [True]
    daemon.kill()
    assert backend.batch_set_v1(["k"], _indices([0])) == [False]

    restarted = start_tierkvd(layout=tierkv.KvLayout(
        LAYERS, HEADS, HEAD_DIM, block_size=PAGE, dtype="bf16"))
    os.unlink(link)
    os.symlink(restarted.socket, link)
    assert backend.batch_exists(["k"]) == 0  # A new, empty store.
    assert backend.batch_set_v1(["k"], _indices([0])) == [True]
    assert backend.batch_get_v1(["k"], _indices([1])) == [True]
    assert torch.equal(pool.page(1), pool.page(0))


def test_sglang_starts_before_tierkvd_and_attaches_later(start_tierkvd,
                                                         tmp_path):
    link = str(tmp_path / "tierkvd.sock")  # Nothing there yet.
    pool = HostPool("layer_first")
    pool.fill(0, seed=6)
    backend = _storage(link, reconnect_wait=0)  # Tries at every call.
    backend.register_mem_pool_host(pool)  # SGLang's start goes on.
    assert backend.client is None
    assert backend.batch_exists(["k"]) == 0
    assert backend.batch_set_v1(["k"], _indices([0])) == [False]
    layout = tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                             dtype="bf16")
    # A tierkvd that refuses the backend (another model): misses, not
    # exceptions, which would end HiCache's threads.
    other = start_tierkvd(layout=layout, model="another/model")
    os.symlink(other.socket, link)
    assert backend.batch_exists(["k"]) == 0
    assert backend.batch_set_v1(["k"], _indices([0])) == [False]
    daemon = start_tierkvd(layout=layout)
    os.unlink(link)
    os.symlink(daemon.socket, link)
    assert backend.batch_set_v1(["k"], _indices([0])) == [True]
    assert backend.batch_get_v1(["k"], _indices([1])) == [True]
    assert torch.equal(pool.page(1), pool.page(0))


def test_tries_to_attach_are_spaced_out_and_start_over_once_attached(
        start_tierkvd, tmp_path):
    link = str(tmp_path / "tierkvd.sock")  # Nothing there yet.
    pool = HostPool("layer_first")
    pool.fill(0, seed=7)
    backend = _storage(link)
    # The backoff's clock, which only the test moves (batch deadlines keep
    # the real one).
    clock = [100.0]
    backend._retry._clock = lambda: clock[0]
    backend.register_mem_pool_host(pool)  # A failed try: the next in 1 s.
    # A tierkvd that refuses the backend (another model).
    layout = tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                             dtype="bf16")
    other = start_tierkvd(layout=layout, model="another/model")
    os.symlink(other.socket, link)
    observer = tierkv.Client.open(other.socket, layout, 1,
                                  model="another/model", name="observer")
    refusals = lambda: observer.stats()["attach"]["refused_mismatch"]
    # Every call is a miss; tierkvd is asked 1 s, 2 s, then 4 s after the
    # last try, not at every call.
    for advance, tries in [(0.0, 0), (1.0, 1), (1.0, 1), (1.0, 2),
                           (3.9, 2), (0.1, 3)]:
        clock[0] += advance
        assert backend.batch_exists(["k"]) == 0
        assert backend.batch_set_v1(["k"], _indices([0])) == [False]
        assert refusals() == tries, (advance, tries)
    # Once it attaches, the waits start over.
    served = start_tierkvd(layout=layout)
    os.unlink(link)
    os.symlink(served.socket, link)
    clock[0] += 8.0
    assert backend.batch_set_v1(["k"], _indices([0])) == [True]
    assert backend.batch_get_v1(["k"], _indices([1])) == [True]
    assert torch.equal(pool.page(1), pool.page(0))
    assert backend._retry.wait == 1.0


def test_a_key_another_worker_is_storing_is_not_a_failed_set(daemon):
    pool = HostPool("layer_first")
    pool.fill(0, seed=7)
    backend = _storage(daemon.socket)
    backend.register_mem_pool_host(pool)
    layout = tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                             dtype="bf16")
    # Another worker (the same key words) has started storing "k" and not
    # finished: tierkvd skips the key rather than store it twice.
    with tierkv.Client.open(daemon.socket, layout, 4,
                            copies="caller") as other:
        words = tierkv.sglang.key_tokens("k", "tp0/1", PAGE)
        other.lookup_chunk(1, words)
        other.allocate(1, [0], 0)
        assert len(other.commit(1, PAGE, [0]).stores) == 1
        # HiCache stops a backup at its first False: "k" is not one.
        assert backend.batch_set_v1(["k", "k2"], _indices([0, 1])) == [True,
                                                                       True]
        assert backend.batch_exists(["k2"]) == 1


def test_context_parallel_ranks_keep_their_slices_apart(daemon):
    """With attention context parallelism, each CP rank of one attention-TP
    rank (the same tp_rank) holds a disjoint slice of every page."""
    pools = [HostPool("page_first"), HostPool("page_first")]
    ranks = [_storage(daemon.socket, cp_rank=r, cp_size=2) for r in (0, 1)]
    for pool, backend in zip(pools, ranks):
        backend.register_mem_pool_host(pool)
    pools[1].fill(0, seed=9)
    assert ranks[1].batch_set_v1(["page"], _indices([0])) == [True]
    assert ranks[0].batch_exists(["page"]) == 0
    assert ranks[0].batch_get_v1(["page"], _indices([0])) == [False]
    assert ranks[1].batch_exists(["page"]) == 1


def test_what_would_end_hicache_threads_is_refused_at_start(daemon):
    """Without "interface_v1", or with a hybrid model's other host pools,
    HiCache would call methods this backend does not have on its prefetch
    and backup threads, each ending at its first call: refused at start."""
    config = SimpleNamespace(tp_rank=0, tp_size=1, is_mla_model=False,
                             extra_config={"socket": daemon.socket})
    with pytest.raises(ValueError, match="interface_v1"):
        TierkvStorage(config, {})
    backend = _storage(daemon.socket)
    pool = HostPool("page_first")
    backend.register_mem_pool_host(pool)

    class PoolName(enum.Enum):  # SGLang's names, as an enum.
        KV = "kv"
        SWA = "swa"
        MAMBA = "mamba"

    # SGLang's hybrid cache controller registers every pool so, the KV
    # pool's too, and then calls only the v2 batch methods.
    for name in (PoolName.KV, PoolName.SWA, PoolName.MAMBA, "draft"):
        with pytest.raises(ValueError, match="registers its pools one by one"):
            backend.register_mem_host_pool_v2(pool, name)


def test_a_backup_of_held_pages_leaves_room_for_the_rest(start_tierkvd):
    """A page tierkvd holds already is answered at once, its lookup
    finished: a backup of many held pages used to pin them until the batch
    ended, up to the worker's share of host slots (half, by default), and
    every page after that share was refused, however often retried."""
    page_bytes = 2 * LAYERS * PAGE * HEADS * HEAD_DIM * 2
    daemon = start_tierkvd(
        layout=tierkv.KvLayout(LAYERS, HEADS, HEAD_DIM, block_size=PAGE,
                               dtype="bf16"),
        host_bytes=40 * page_bytes)  # 40 slots, 20 a worker may pin.
    pool = HostPool("page_first", pages=32)
    for p in range(32):
        pool.fill(p, seed=p)
    backend = _storage(daemon.socket)
    backend.register_mem_pool_host(pool)
    keys = [f"backup-{i}" for i in range(32)]
    assert backend.batch_set_v1(keys[:16], _indices(list(range(16)))) == [
        True] * 16
    # 16 held, then 16 new: the new ones' stores pin 16 slots, no more.
    assert backend.batch_set_v1(keys, _indices(list(range(32)))) == [
        True] * 32
    assert backend.client.stats()["host"]["pinned_slots"] == 0
    assert backend.batch_exists(keys) == 32


def test_a_clear_hides_every_page_stored_before(daemon):
    """SGLang's clear of HiCache storage (after new weights): this rank
    finds none of the pages stored before, its own or another backend's,
    and what it backs up from then on is found again. Another backend
    that was not cleared (an engine on the old weights) still finds the
    old pages."""
    pool = HostPool("layer_first")
    pool.fill(0, seed=3)
    pool.fill(1, seed=4)
    cleared, other = _storage(daemon.socket), _storage(daemon.socket)
    for backend in (cleared, other):
        backend.register_mem_pool_host(pool)
    assert cleared.batch_set_v1(["a", "b"], _indices([0, 1])) == [True] * 2
    assert cleared.batch_exists(["a", "b"]) == 2

    cleared.clear()
    assert cleared.batch_exists(["a", "b"]) == 0
    assert cleared.batch_get_v1(["a"], _indices([5])) == [False]
    assert torch.count_nonzero(pool.page(5)) == 0
    assert other.batch_exists(["a", "b"]) == 2
    # Backed up again under the new keys: found, and loads what it stored.
    assert cleared.batch_set_v1(["a"], _indices([1])) == [True]
    assert cleared.batch_exists(["a", "b"]) == 1
    assert cleared.batch_get_v1(["a"], _indices([6])) == [True]
    assert torch.equal(pool.page(6), pool.page(1))
    cleared.close()
    other.close()
