"""The tierkv package against a real tierkvd: attach, store, load, errors."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import tierkv

BLOCK = 16  # Tokens per block in the test layout.


def prompt(seed: int, blocks: int, extra: int = 0) -> list[int]:
    """`blocks` full blocks (plus `extra` tokens) no other seed shares."""
    start = seed * 100_000
    return list(range(start, start + blocks * BLOCK + extra))


def wait_all(client: tierkv.Client, count: int) -> list[tierkv.FinishedTransfer]:
    """Waits for `count` finished transfers, checks them and completes them."""
    finished: list[tierkv.FinishedTransfer] = []
    while len(finished) < count:
        done = client.wait_events(10.0)
        assert done, "no transfer finished in 10 s"
        for f in done:
            assert f.ok, f.error
        client.complete(done)
        finished += done
    return finished


def store(client: tierkv.Client, request: int, tokens: list[int],
          device_blocks: list[int]) -> tierkv.TransferEvent:
    assert client.lookup(request, tokens).hit_tokens == 0
    client.allocate(request, device_blocks, 0)
    commit = client.commit(request, len(tokens), device_blocks)
    assert commit.store_status is None
    assert len(commit.stores) == 1
    wait_all(client, 1)
    client.finish(request)
    return commit.stores[0]


def load(client: tierkv.Client, request: int, tokens: list[int],
         device_blocks: list[int]) -> tierkv.TransferEvent:
    hit = client.lookup(request, tokens + [7])
    assert hit.hit_tokens == len(tokens)
    alloc = client.allocate(request, device_blocks, hit.hit_tokens)
    assert alloc.load is not None and not alloc.load_pending
    wait_all(client, 1)
    client.finish(request)
    return alloc.load


def paged_caches(layout: tierkv.KvLayout, num_blocks: int,
                 heads: int | None = None) -> list[torch.Tensor]:
    """vLLM's paged KV caches: per layer [2, blocks, block, heads, dim]."""
    generator = torch.Generator().manual_seed(15)
    shape = (2, num_blocks, layout.block_size, heads or layout.num_kv_heads,
             layout.head_dim)
    return [torch.randn(shape, generator=generator).to(torch.bfloat16)
            for _ in range(layout.num_layers)]


def test_attach_store_load_on_the_emulated_device(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 8, name="py") as client:
        assert client.connected and not client.embedded
        assert client.copies == "client"
        assert client.layout == layout
        tokens = prompt(1, 2)
        stored = store(client, 1, tokens, [0, 1])
        assert stored.kind == "store" and stored.device_blocks == [0, 1]
        loaded = load(client, 2, tokens, [4, 5])
        assert loaded.kind == "load" and loaded.device_blocks == [4, 5]
        assert sorted(loaded.host_blocks) == sorted(stored.host_blocks)
        host = client.stats()["host"]
        assert host["stores_completed"] == 2
        assert host["loads_completed"] == 2
        assert client.transfers_in_flight == 0


def test_chunks_are_keyed_by_their_virtual_start_and_variant(tierkvd,
                                                             layout):
    with tierkv.Client.open(tierkvd.socket, layout, 8, name="py") as client:
        chunk = prompt(3, 2)
        rope = "head_dim=64 theta=10000"  # Any text: it is hashed as is.
        keyed = dict(virtual_start=16, rope_config=rope, variant="adapter-a")
        assert client.lookup_chunk(1, chunk, **keyed).hit_tokens == 0
        client.allocate(1, [0, 1], 0)
        assert len(client.commit(1, len(chunk), [0, 1]).stores) == 1
        wait_all(client, 1)
        client.finish(1)

        def hits(**keys) -> int:
            found = client.lookup_chunk(2, chunk, **keys).hit_tokens
            client.finish(2)
            return found

        assert hits(**keyed) == len(chunk)
        assert hits(**dict(keyed, variant="adapter-b")) == 0
        assert hits(**dict(keyed, rope_config="rope(theta=500000)")) == 0
        assert hits(**dict(keyed, virtual_start=0)) == 0
        assert hits(virtual_start=16, variant="adapter-a") == 0
        assert hits(virtual_start=16) == 0  # No variant: other keys.


def test_registered_torch_tensors_in_vllm_paged_layout(tierkvd, layout):
    caches = paged_caches(layout, num_blocks=8)
    before = [c.clone() for c in caches]
    device = tierkv.RegisteredDevice.paged(layout, caches)
    assert device.num_blocks == 8
    assert device.shard_bytes == layout.block_bytes
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        tokens = prompt(2, 2)
        store(client, 1, tokens, [1, 2])
        load(client, 2, tokens, [5, 6])
    for cache, old in zip(caches, before):
        # Blocks 5 and 6 now hold 1 and 2, K and V; the rest is untouched.
        assert torch.equal(cache[:, 5:7], old[:, 1:3])
        assert torch.equal(cache[:, :5], old[:, :5])
        assert torch.equal(cache[:, 7:], old[:, 7:])


def test_one_tensor_for_two_layers_or_for_k_and_v_is_refused(layout):
    """[t] * num_layers, or (t, t): every copy of one layer or plane would
    read and write another's bytes, stored and served as both."""
    caches = paged_caches(layout, num_blocks=4)
    with pytest.raises(tierkv.InvalidArgumentError, match="overlap"):
        tierkv.RegisteredDevice.paged(layout, [caches[0]] * layout.num_layers)
    planes = [(c[0], c[0]) for c in caches]
    with pytest.raises(tierkv.InvalidArgumentError,
                       match=r"layers\[\d\]\.key and layers\[\d\]\.value overlap"):
        tierkv.RegisteredDevice.from_layers(layout, planes)
    # The torch copy path (tensors on any device) refuses them too.
    from tierkv._torch_copy import TorchCopier
    with pytest.raises(tierkv.InvalidArgumentError, match="overlap"):
        TorchCopier(layout, planes)
    with pytest.raises(tierkv.InvalidArgumentError, match="overlap"):
        TorchCopier(layout, [(caches[0][0], caches[0][1])] * layout.num_layers)
    TorchCopier(layout, [(c[0], c[1]) for c in caches])  # Taken.


def test_a_registered_tensor_given_other_memory_keeps_the_old_alive(
        tmp_path):
    """`t.data = ...` swaps a registered tensor's storage: the copy engine
    goes on with the registered memory, which the device keeps alive. In a
    process of its own, with tensors large enough that freed memory is
    unmapped: a store from freed memory crashed it."""
    script = tmp_path / "swap.py"
    script.write_text(
        "import gc, tierkv, torch\n"
        "L = tierkv.KvLayout(2, 2, 64, block_size=16, dtype='bf16')\n"
        "nb = 8192  # 64 MiB a layer: freed, it is unmapped\n"
        "caches = [torch.full((2, nb, 16, 2, 64), 3.0, dtype=torch.bfloat16)\n"
        "          for _ in range(2)]\n"
        "dev = tierkv.RegisteredDevice.paged(L, caches)\n"
        "for t in caches:\n"
        "    t.data = torch.zeros((2, 16, 16, 2, 64), dtype=torch.bfloat16)\n"
        "gc.collect()\n"
        "with tierkv.Client.open_embedded(L, device=dev,\n"
        "                                 host_bytes=8 << 20) as c:\n"
        "    c.lookup(1, list(range(32)))\n"
        "    c.allocate(1, [nb - 1], 0)\n"
        "    c.commit(1, 16, [nb - 1])\n"
        "    done = c.wait_events(10)\n"
        "    assert done and done[0].ok, done\n"
        "    c.complete(done)\n"
        "print('stored')\n")
    run = subprocess.run([sys.executable, str(script)], env=dict(os.environ),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "stored\n", (
        run.returncode, run.stderr[-2000:])


def test_first_calls_from_threads_at_once_do_not_deadlock(tmp_path):
    """Two threads' first calls in a process that has not imported numpy:
    the binding imports numpy's API when tierkv is imported, not inside a
    first call, where one thread giving up the GIL deadlocked the other."""
    script = tmp_path / "threads.py"
    script.write_text(
        "import sys, threading\n"
        "import tierkv\n"
        "L = tierkv.KvLayout(2, 2, 64, block_size=16, dtype='bf16')\n"
        "c = tierkv.Client.open_embedded(L, 8, host_bytes=8 << 20)\n"
        "def work(k):\n"
        "    c.lookup(k, list(range(k * 1000, k * 1000 + 32)))\n"
        "ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n"
        "print('done')\n")
    env = dict(os.environ)
    for attempt in range(5):
        run = subprocess.run([sys.executable, str(script)], env=env,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout == "done\n", run.stderr


def test_registered_dict_of_caches_keeps_layer_order(tierkvd, layout):
    caches = paged_caches(layout, num_blocks=4)
    named = {f"model.layers.{i}.attn": c for i, c in enumerate(caches)}
    device = tierkv.RegisteredDevice.paged(layout, named)
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        store(client, 1, prompt(3, 1), [0])
        load(client, 2, prompt(3, 1), [3])
    for cache in caches:
        assert torch.equal(cache[:, 3], cache[:, 0])


def test_cross_layer_numpy_bf16_view(tierkvd, layout):
    rng = np.random.default_rng(15)
    shape = (6, layout.num_layers, 2, layout.block_size, layout.num_kv_heads,
             layout.head_dim)
    pool = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    device = tierkv.RegisteredDevice.cross_layer(layout, pool)
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        store(client, 1, prompt(4, 2), [0, 1])
        load(client, 2, prompt(4, 2), [4, 5])
    np.testing.assert_array_equal(pool[4:6], pool[0:2])
    # The other byte order would be stored, and served, as other values.
    swapped = pool.astype(pool.dtype.newbyteorder("S"))
    with pytest.raises(tierkv.InvalidArgumentError, match="byte order"):
        tierkv.RegisteredDevice.cross_layer(layout, swapped)


def test_rank_clients_copy_their_shards_of_one_block(tierkvd, layout):
    # A scheduler decides; two rank clients, each over its half of the KV
    # heads, copy every event it hands out. A worker with every head then
    # loads the block whole: the two halves met in one host slot.
    full = paged_caches(layout, num_blocks=4)
    halves = [[c[:, :, :, r:r + 1].clone() for c in full] for r in (0, 1)]
    with tierkv.Client.open(tierkvd.socket, layout, 4, copies="ranks",
                            ranks=2) as scheduler:
        ranks = []
        for r in (0, 1):
            shard = tierkv.RegisteredDevice.paged(layout, halves[r], rank=r,
                                                  num_ranks=2)
            assert shard.shard_bytes == layout.block_bytes // 2
            ranks.append(tierkv.Client.open(
                tierkvd.socket, layout, device=shard,
                scheduler=scheduler.worker_id, rank=r))
        tokens = prompt(5, 1)
        scheduler.lookup(1, tokens)
        scheduler.allocate(1, [2], 0)
        event = scheduler.commit(1, len(tokens), [2]).stores[0]
        # What the scheduler sends its workers travels pickled.
        event = pickle.loads(pickle.dumps(event))
        for rank in ranks:
            rank.start(event)
        for rank in ranks:
            wait_all(rank, 1)
        scheduler.wait_idle(10.0)
        scheduler.finish(1)
        for rank in ranks:
            rank.close()
    whole = paged_caches(layout, num_blocks=4)
    device = tierkv.RegisteredDevice.paged(layout, whole)
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        load(client, 2, tokens, [0])
    for layer, cache in enumerate(whole):
        assert torch.equal(cache[:, 0], full[layer][:, 2])


def test_embedded_with_a_disk_tier(tmp_path, layout):
    caches = paged_caches(layout, num_blocks=4)
    device = tierkv.RegisteredDevice.paged(layout, caches)
    with tierkv.Client.open_embedded(layout, device=device,
                                     host_bytes=1 << 20,
                                     disk_path=str(tmp_path / "disk"),
                                     disk_bytes=64 << 20) as client:
        assert client.embedded
        store(client, 1, prompt(6, 1), [0])
        load(client, 2, prompt(6, 1), [1])
        client.wait_idle(10.0)
        stats = client.stats()
        assert stats["disk"] is not None
        assert stats["disk"]["capacity_bytes"] == 64 << 20
    for cache in caches:
        assert torch.equal(cache[:, 1], cache[:, 0])


def test_torch_copies_move_the_bytes_a_registered_device_does(tierkvd,
                                                             layout):
    """TorchCopier (the vLLM connector's copies for tensors off the host)
    against RegisteredDevice, in FlashInfer's [blocks, 2, ...] layout and
    per rank: a block stored as two torch rank shards loads whole through
    tierkv's copy engine, and back."""
    from tierkv._torch_copy import TorchCopier
    full = paged_caches(layout, num_blocks=4)  # [2, blocks, block, heads, dim]
    flash = [c.transpose(0, 1).contiguous() for c in full]  # [blocks, 2, ...]
    half = layout.num_kv_heads // 2
    shards = [[f[:, :, :, r * half:(r + 1) * half].clone() for f in flash]
              for r in (0, 1)]
    tokens = prompt(8, 1)
    with tierkv.Client.open(tierkvd.socket, layout, 4, copies="ranks",
                            ranks=2) as scheduler:
        ranks = [tierkv.Client.open(
            tierkvd.socket, layout, 4, copies="caller",
            scheduler=scheduler.worker_id, rank=r) for r in (0, 1)]
        copiers = [TorchCopier(layout, [(t[:, 0], t[:, 1]) for t in shards[r]],
                               rank=r, num_ranks=2) for r in (0, 1)]
        scheduler.lookup(1, tokens)
        scheduler.allocate(1, [2], 0)
        stored = scheduler.commit(1, len(tokens), [2]).stores[0]
        for r in (0, 1):
            copiers[r].store(ranks[r], stored)
            ranks[r].complete([tierkv.FinishedTransfer(stored, None,
                                                       ranks[r].session)])
        scheduler.finish(1)
        for r in ranks:
            r.close()
    # Loaded whole into block 0 by tierkv's copy engine: the halves met.
    whole = [torch.zeros_like(c) for c in full]
    device = tierkv.RegisteredDevice.paged(layout, whole)
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        load(client, 2, tokens, [0])
        # Stored by tierkv's copy engine from block 0, loaded by torch into
        # block 3 of one all-heads FlashInfer cache.
        store(client, 3, prompt(9, 1), [0])
    for layer, cache in enumerate(whole):
        assert torch.equal(cache[:, 0], full[layer][:, 2])
    back = [torch.zeros_like(f) for f in flash]
    with tierkv.Client.open(tierkvd.socket, layout, 4,
                            copies="caller") as client:
        copier = TorchCopier(layout, [(t[:, 0], t[:, 1]) for t in back])
        hit = client.lookup(4, prompt(9, 1) + [7])
        assert hit.hit_tokens == BLOCK
        event = client.allocate(4, [3], BLOCK).load
        copier.load(client, event)
        client.complete([tierkv.FinishedTransfer(event, None,
                                                 client.session)])
        client.finish(4)
    for layer, f in enumerate(back):
        assert torch.equal(f[3], flash[layer][2])


def test_torch_copies_run_in_chunks_and_skip_empty_loads(tierkvd, layout,
                                                         monkeypatch):
    import tierkv._torch_copy as torch_copy
    monkeypatch.setattr(torch_copy, "_CHUNK_BYTES", 1)  # A block a chunk.
    caches = paged_caches(layout, num_blocks=8)
    copier = torch_copy.TorchCopier(layout, [(c[0], c[1]) for c in caches])
    chunks = []
    whole_chunks = copier._chunks

    def counted_chunks(event):
        for index, slots in whole_chunks(event):
            chunks.append(len(slots))
            yield index, slots

    copier._chunks = counted_chunks
    tokens = prompt(10, 3)
    with tierkv.Client.open(tierkvd.socket, layout, 8,
                            copies="caller") as client:
        client.lookup(1, tokens)
        client.allocate(1, [0, 1, 2], 0)
        event = client.commit(1, len(tokens), [0, 1, 2]).stores[0]
        copier.store(client, event)
        assert chunks == [1, 1, 1]
        client.complete([tierkv.FinishedTransfer(event, None,
                                                 client.session)])
        client.finish(1)
        assert client.lookup(2, tokens + [7]).hit_tokens == len(tokens)
        event = client.allocate(2, [5, 6, 7], len(tokens)).load
        copier.load(client, event)
        cut = tierkv.TransferEvent("load", 99, 2, [], [])
        copier.load(client, cut)  # Cut short before its first: nothing.
        assert chunks == [1] * 6
        client.complete([tierkv.FinishedTransfer(event, None,
                                                 client.session)])
        client.finish(2)
    for cache in caches:
        assert torch.equal(cache[:, 5:8], cache[:, 0:3])


def test_caller_mode_copies_through_host_block_views(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 4,
                            copies="caller") as client:
        assert client.copies == "caller"
        tokens = prompt(7, 2)
        client.lookup(1, tokens)
        client.allocate(1, [0, 1], 0)
        event = client.commit(1, len(tokens), [0, 1]).stores[0]
        assert client.poll_events() == []  # The engine copies, not tierkv.
        written = []
        for i, slot in enumerate(event.host_blocks):
            view = client.host_block(slot)
            assert len(view) == layout.block_bytes and not view.readonly
            payload = bytes([i + 1]) * layout.block_bytes
            view[:] = payload
            written.append(payload)
        client.complete([tierkv.FinishedTransfer(event, None,
                                                 client.session)])
        client.finish(1)
        client.lookup(2, tokens + [7])
        loaded = client.allocate(2, [2, 3], len(tokens)).load
        assert loaded is not None
        got = [bytes(client.host_block(s)) for s in loaded.host_blocks]
        assert got == written
        client.complete([tierkv.FinishedTransfer(loaded, None,
                                                 client.session)])
        assert client.stats()["host"]["loads_completed"] == 2


def test_a_host_block_view_keeps_its_mapping_after_close(tierkvd, layout):
    client = tierkv.Client.open(tierkvd.socket, layout, 4, copies="caller")
    client.lookup(1, prompt(11, 1))
    client.allocate(1, [0], 0)
    slot = client.commit(1, BLOCK, [0]).stores[0].host_blocks[0]
    view = client.host_block(slot)
    client.close()
    # The view holds the attachment: its memory stays mapped until it goes.
    view[:4] = b"kv!!"
    assert bytes(view[:4]) == b"kv!!"
    with pytest.raises(tierkv.FailedPreconditionError):
        client.host_block(slot)
    del view
    with pytest.raises(tierkv.OutOfRangeError):
        with tierkv.Client.open(tierkvd.socket, layout, 4,
                                copies="caller") as other:
            other.host_block(0)  # The null slot.


def test_reconnect_is_refused_while_a_host_block_view_is_alive(
        start_tierkvd, layout, tmp_path):
    daemon = start_tierkvd()
    link = str(tmp_path / "tierkvd.sock")
    os.symlink(daemon.socket, link)
    with tierkv.Client.open(link, layout, 4, copies="caller") as client:
        view = client.host_block(1)
        daemon.kill()
        restarted = start_tierkvd()
        os.unlink(link)
        os.symlink(restarted.socket, link)
        # Attaching anew would unmap the segment the view points into.
        with pytest.raises(tierkv.FailedPreconditionError,
                           match="1 host_block"):
            client.reconnect()
        view[:4] = b"kv!!"  # Still mapped.
        del view
        gc.collect()
        client.reconnect()
        assert client.connected
        assert len(client.host_block(1)) == layout.block_bytes


def test_a_registered_device_backs_one_open_client_at_a_time(tierkvd,
                                                             layout):
    caches = paged_caches(layout, num_blocks=4)
    device = tierkv.RegisteredDevice.paged(layout, caches)
    first = tierkv.Client.open(tierkvd.socket, layout, device=device)
    with pytest.raises(tierkv.AlreadyExistsError, match="already backs"):
        tierkv.Client.open(tierkvd.socket, layout, device=device)
    with pytest.raises(tierkv.AlreadyExistsError):
        tierkv.Client.open_embedded(layout, device=device)
    first.close()
    with tierkv.Client.open_embedded(layout, device=device) as second:
        store(second, 1, prompt(3, 1), [0])
    # A failed open releases the device too.
    with pytest.raises(tierkv.InvalidArgumentError):
        tierkv.Client.open(tierkvd.socket,
                           tierkv.KvLayout(3, 2, 64, block_size=16),
                           device=device)
    with tierkv.Client.open(tierkvd.socket, layout, device=device):
        pass


def test_close_detaches_while_another_thread_waits(tierkvd, layout):
    """close() while another thread waits on the client detaches once that
    thread's current slice ends: the device is free for a new client as
    soon as close() returns, and the waiter gets a closed-client error."""
    caches = paged_caches(layout, num_blocks=4)
    device = tierkv.RegisteredDevice.paged(layout, caches)
    client = tierkv.Client.open(tierkvd.socket, layout, device=device)
    started = threading.Event()
    outcome: list[object] = []

    def wait() -> None:
        started.set()
        try:
            client.wait_events(30)
            outcome.append("returned")
        except tierkv.Error as error:
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    started.wait()
    # Into the wait; were the machine too slow for that, the wait would
    # begin closed and the test check less, never fail falsely.
    time.sleep(0.3)
    client.close()
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as other:
        store(other, 1, prompt(3, 1), [0])
    waiter.join(10)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], tierkv.FailedPreconditionError), outcome


def test_a_device_must_match_the_client_layout(tierkvd, layout):
    # f16 and bf16 blocks have the same bytes: only the layouts tell them
    # apart, and a store under the wrong one is wrong KV for every loader.
    device = tierkv.RegisteredDevice.paged(layout, paged_caches(layout, 4))
    f16 = tierkv.KvLayout(layout.num_layers, layout.num_kv_heads,
                          layout.head_dim, layout.block_size, "f16")
    assert f16.block_bytes == layout.block_bytes
    with pytest.raises(tierkv.InvalidArgumentError,
                       match="registered with layout"):
        tierkv.Client.open_embedded(f16, device=device)
    # One rank's shard stores only its heads: not a whole block's worth.
    half = [c[:, :, :, 0:1].clone() for c in paged_caches(layout, 4)]
    shard = tierkv.RegisteredDevice.paged(layout, half, rank=0, num_ranks=2)
    with pytest.raises(tierkv.InvalidArgumentError, match="rank client"):
        tierkv.Client.open(tierkvd.socket, layout, device=shard)
    with tierkv.Client.open_embedded(layout, device=device):
        pass


def test_a_failed_caller_copy_is_not_served(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 4,
                            copies="caller") as client:
        tokens = prompt(8, 1)
        client.lookup(1, tokens)
        client.allocate(1, [0], 0)
        event = client.commit(1, len(tokens), [0]).stores[0]
        failed = tierkv.FinishedTransfer(event,
                                         tierkv.DataLossError("copy failed"))
        assert not failed.ok and failed.error.code == "DATA_LOSS"
        client.complete([failed])
        client.finish(1)
        assert client.lookup(2, tokens + [7]).hit_tokens == 0


def test_wrong_layout_names_both_layouts(tierkvd, layout):
    other = tierkv.KvLayout(layout.num_layers, layout.num_kv_heads, 128)
    with pytest.raises(tierkv.FailedPreconditionError) as raised:
        tierkv.Client.open(tierkvd.socket, other, 4)
    assert raised.value.code == "FAILED_PRECONDITION"
    assert str(layout) in raised.value.message
    assert str(other) in raised.value.message


def test_no_tierkvd_on_the_socket(tmp_path, layout):
    with pytest.raises(tierkv.UnavailableError) as raised:
        tierkv.Client.open(str(tmp_path / "none.sock"), layout, 4)
    assert isinstance(raised.value, ConnectionError)
    assert "none.sock" in raised.value.message


def test_bad_tensors_are_refused_naming_the_mismatch(layout):
    caches = paged_caches(layout, num_blocks=4)
    with pytest.raises(tierkv.InvalidArgumentError, match=r"kv_caches\[1\]"):
        bad = list(caches)
        bad[1] = torch.zeros(2, 4, layout.block_size, 3, layout.head_dim,
                             dtype=torch.bfloat16)
        tierkv.RegisteredDevice.paged(layout, bad)
    with pytest.raises(tierkv.InvalidArgumentError, match="torch.bfloat16"):
        tierkv.RegisteredDevice.paged(layout, [c.float() for c in caches])
    with pytest.raises(tierkv.InvalidArgumentError, match="2 layers"):
        tierkv.RegisteredDevice.paged(layout, caches[:1])
    with pytest.raises(ValueError, match="densely packed"):
        transposed = [c.transpose(3, 4).contiguous().transpose(3, 4)
                      for c in caches]
        tierkv.RegisteredDevice.paged(layout, transposed)
    with pytest.raises(tierkv.InvalidArgumentError, match="not divisible"):
        tierkv.RegisteredDevice.paged(tierkv.KvLayout(2, 3, 64), caches,
                                      num_ranks=2)
    with pytest.raises(tierkv.InvalidArgumentError, match="numpy array"):
        tierkv.RegisteredDevice.paged(layout, [[0] * 4] * 2)


def test_a_device_keeps_its_tensors_alive(tierkvd, layout):
    caches = paged_caches(layout, num_blocks=4)
    device = tierkv.RegisteredDevice.paged(layout, caches)
    # No other reference to the tensors remains: the device's keeps them.
    with tierkv.Client.open(tierkvd.socket, layout, device=device) as client:
        del device
        store(client, 1, prompt(9, 1), [0])
        load(client, 2, prompt(9, 1), [1])


def test_stats_is_a_dict_of_the_store(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 4, name="stats") as client:
        stats = client.stats()
        assert stats["block_size"] == layout.block_size
        assert stats["host"]["slot_bytes"] == layout.block_bytes
        assert stats["host"]["capacity_slots"] > 0
        assert stats["disk"] is None
        assert stats["attach"]["attached"] >= 1
        names = [w["name"] for w in stats["workers"]]
        assert "stats" in names
        assert stats["store"] == tierkvd.store
        latency = stats["store_latency"]
        assert len(latency["buckets"]) == len(latency["bucket_bounds_us"]) + 1


def test_tokens_must_be_integers(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 4) as client:
        with pytest.raises(tierkv.InvalidArgumentError, match="dtype"):
            client.lookup(1, np.array([1.9, 2.2]))
        with pytest.raises(tierkv.InvalidArgumentError, match="dtype"):
            client.lookup(2, [1.5])
        with pytest.raises(tierkv.InvalidArgumentError, match="uint32"):
            client.lookup(3, [-1])
        # Past int64 too: named as given, not wrapped around.
        with pytest.raises(tierkv.InvalidArgumentError,
                           match="token 9223372036854775808 at index 0"):
            client.lookup(3, [2**63])
        with pytest.raises(tierkv.InvalidArgumentError,
                           match="token 4294967296 at index 0"):
            client.lookup(3, np.array([2**32], dtype=np.uint64))
        small = np.array([1, 2, 3], dtype=np.uint16)
        assert client.lookup(4, small).hit_tokens == 0


def test_lookup_extras_must_name_their_items(tierkvd, layout):
    with tierkv.Client.open(tierkvd.socket, layout, 4) as client:
        tokens = list(range(40))
        for bad in ([("id", 0)], [("", 0, 4)], [("id", -1, 4)],
                    [("id", 0, 0)]):
            with pytest.raises(ValueError, match="mm_items"):
                client.lookup(1, tokens, mm_items=bad)
        with pytest.raises(TypeError):
            client.lookup(1, tokens, mm_items=[7])
        # Items of the wrong types are TypeErrors naming the item.
        for bad in (["abc"], [("id", 1.0, 4)], [(None, 0, 4)], [(7, 0, 4)],
                    [("id", 0, 2**64)]):
            with pytest.raises(TypeError, match=r"mm_items\[0\]"):
                client.lookup(1, tokens, mm_items=bad)
        with pytest.raises(TypeError):
            client.lookup(1, tokens, 0, 5)  # The extras are keywords.
        ok = client.lookup(2, tokens, lora_id=3, cache_salt="s",
                           mm_items=[(b"raw", 1, 2), ["listed", 20, 4]])
        assert ok.hit_tokens == 0


def test_a_signal_interrupts_a_long_wait_and_others_call_meanwhile(
        tierkvd, layout):
    """A long wait_events (or wait_idle) is cut into short waits: a signal's
    handler runs within one of them (Ctrl-C stops an engine waiting on
    tierkv), and another thread's call on the client goes between them."""
    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with tierkv.Client.open(tierkvd.socket, layout, 4) as client:
            started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(Interrupted):
                client.wait_events(30.0)
            assert time.monotonic() - started < 20
            # Another thread's call is served during a long wait.
            waiting = threading.Thread(target=client.wait_events,
                                       args=(10.0,))
            waiting.start()
            time.sleep(0.3)  # Into the wait (no harm if not).
            started = time.monotonic()
            assert client.stats()["workers"]
            # Not after the wait's 10 s: between two of its slices.
            assert time.monotonic() - started < 6.0
            waiting.join()
        # A client whose caller copies has nothing to wait for: at once.
        with tierkv.Client.open(tierkvd.socket, layout, 4,
                                copies="caller") as caller:
            started = time.monotonic()
            assert caller.wait_events(10.0) == []
            assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_closed_client_refuses_calls(tierkvd, layout):
    client = tierkv.Client.open(tierkvd.socket, layout, 4)
    client.close()
    assert client.closed
    with pytest.raises(tierkv.FailedPreconditionError):
        client.lookup(1, [1, 2, 3])
    with pytest.raises(tierkv.FailedPreconditionError):
        client.worker_id


def test_a_lost_tierkvd_is_unavailable_until_reconnect(start_tierkvd, layout):
    daemon = start_tierkvd()
    with tierkv.Client.open(daemon.socket, layout, 4) as client:
        daemon.kill()
        with pytest.raises(tierkv.UnavailableError):
            client.lookup(1, prompt(10, 1))
        assert not client.connected
        assert isinstance(client.connection_error, tierkv.UnavailableError)
        with pytest.raises(tierkv.UnavailableError):
            client.reconnect()


def test_events_are_plain_picklable_values():
    event = tierkv.TransferEvent("load", 3, 42, [1, 2], [7, 8],
                                 failed_blocks=1)
    assert pickle.loads(pickle.dumps(event)) == event
    assert event.kind == "load" and event.request == 42
    assert event != tierkv.TransferEvent("store", 3, 42, [1, 2], [7, 8])
    assert event != None and event in [None, event]  # noqa: E711
    finished = tierkv.FinishedTransfer(event)
    assert finished.ok and finished.error is None
    assert finished.loaded_blocks == 2
    failed = pickle.loads(pickle.dumps(tierkv.FinishedTransfer(
        event, tierkv.DataLossError("bad copy"), session=3)))
    assert failed.event == event and failed.session == 3
    assert failed.error == tierkv.DataLossError("bad copy")
    assert failed.loaded_blocks == 0
    assert not tierkv.FinishedTransfer(event, "copy failed").ok
    # False, 0 or "" read as "no error", yet would count as a failed copy.
    for unclear in (False, True, 0, 1.0, np.False_, np.int64(0),
                    torch.tensor(False)):
        with pytest.raises(TypeError, match="None for a copy that succeeded"):
            tierkv.FinishedTransfer(event, unclear)
    with pytest.raises(ValueError, match="empty message"):
        tierkv.FinishedTransfer(event, "")
    with pytest.raises(tierkv.InvalidArgumentError, match="kind"):
        tierkv.TransferEvent("copy", 0, 0, [], [])
    with pytest.raises(tierkv.InvalidArgumentError, match="host_blocks"):
        tierkv.TransferEvent("load", 0, 0, [1], [])


def test_layouts_compare_print_and_validate():
    layout = tierkv.KvLayout(32, 8, 128)
    assert layout.block_bytes == 2 << 20
    assert str(layout) == "layers=32 kv_heads=8 head_dim=128 block=16 dtype=bf16"
    assert layout == tierkv.KvLayout(32, 8, 128, 16, "bf16")
    assert (layout == None) is False and layout != "KvLayout"  # noqa: E711
    assert pickle.loads(pickle.dumps(layout)) == layout
    with pytest.raises(tierkv.InvalidArgumentError, match="dtype"):
        tierkv.KvLayout(2, 2, 64, dtype="f8")


def test_errors_carry_code_and_message():
    error = tierkv.error_for("DEADLINE_EXCEEDED", "tierkvd is slow")
    assert isinstance(error, tierkv.DeadlineExceededError)
    assert isinstance(error, TimeoutError)
    assert error.code == "DEADLINE_EXCEEDED"
    assert error.message == "tierkvd is slow"
    assert isinstance(tierkv.error_for("OUT_OF_RANGE", ""), IndexError)
    assert isinstance(tierkv.error_for("PERMISSION_DENIED", ""),
                      PermissionError)
