"""tierkv as an SGLang HiCache storage backend (HiCacheStorage's interface).

Load it as a 'dynamic' backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "tierkv",
        "module_path": "tierkv.sglang", "class_name": "TierkvStorage",
        "interface_v1": 1, "socket": "/run/tierkv/tierkvd.sock"}'

("interface_v1": 1 makes HiCache call batch_get_v1 / batch_set_v1, which
copy between tierkvd and SGLang's host KV pool without a staging buffer.)

SGLang hands the backend page keys (strings, each already a hash of its
whole prefix) and host pool indices, never tokens. Each page is stored as a
one-block position-independent chunk (tierkv's chunk lookups): its "tokens"
are block_size words derived from the key (BLAKE2b), so a key names one
block and tierkv keys the block by those words alone. The host pool is this
backend's device memory (RegisteredDevice.from_layers over its K and V
tensors, one device block per page); tierkvd's host tier and disk tier sit
behind it.

Tensor parallelism: every SGLang TP rank has its own host pool holding its
shard of the KV heads, and its own backend. The ranks are kept apart: each
rank's key words are derived from the key and the rank ("tp<rank>/<size>"),
and the layout is the rank's own (num_kv_heads = the heads of one rank), so
start tierkvd with --kv-heads = the model's KV heads / TP size. A rank never
reads another rank's heads.

Not for MLA models (their host pool has no separate K and V).

HiCache calls the backend from its prefetch and backup threads at once; the
backend serializes its batches with a lock (one tierkv client is driven by
one thread at a time). Those threads stop for good on an exception, so a
tierkvd out of reach, too slow (see TierkvStorage) or refusing for lack of
room is a miss, or nothing stored, logged (at most every 30 s, with how many
calls failed meanwhile); the next call attaches again. So is one out of
reach when SGLang starts (register_mem_pool_host). A call HiCache
makes wrongly (before register_mem_pool_host, a page outside the pool)
raises.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
import uuid
from typing import Any, List, Optional

import numpy as np

import tierkv
from tierkv._engines import Backoff, config_value, layout_dtype

logger = logging.getLogger(__name__)

# What a batch answers as a miss (or as nothing stored) instead of raising.
_TRANSIENT = (tierkv.UnavailableError, tierkv.DeadlineExceededError,
              tierkv.ResourceExhaustedError)
# Seconds between two warnings about them.
_WARN_EVERY = 30.0


class _Throttled:
    """A warning logged at most every _WARN_EVERY seconds, with how many
    times it was due since it was last logged."""

    def __init__(self) -> None:
        self._due = 0
        self._last = float("-inf")

    def due(self) -> Optional[int]:
        """Counts one more occasion; when the warning is to be logged now,
        the occasions since the last one (then starts over), else None."""
        self._due += 1
        now = time.monotonic()
        if now - self._last < _WARN_EVERY:
            return None
        count, self._due, self._last = self._due, 0, now
        return count

try:  # SGLang's interface when SGLang is installed.
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage)
    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

    class HiCacheStorage:  # type: ignore[no-redef]
        """The part of SGLang's HiCacheStorage this backend implements."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host


DEFAULT_SOCKET = "/run/tierkv/tierkvd.sock"
# A page is looked up by page_size 32-bit words derived from its key; fewer
# than 4 (128 bits) would let distinct keys collide.
MIN_PAGE_SIZE = 4
# How long a set batch waits for its copies. Default: 60 s.
DEFAULT_BATCH_TIMEOUT = 60.0
# How long a get batch waits for its copies by default: SGLang's defaults
# for how long HiCache waits for a prefetch under its "timeout" policy
# (prefetch_timeout_base, prefetch_timeout_per_ki_token of its extra config,
# which SGLang takes out before the backend sees it), for the batch's
# tokens. Past that HiCache has stopped waiting for the pages (under its
# default "best_effort" policy it waits for none), and its one prefetch
# thread should go on to the next prefetch.
DEFAULT_GET_TIMEOUT_BASE = 1.0
DEFAULT_GET_TIMEOUT_PER_KI_TOKEN = 0.25


def key_tokens(key: str, salt: str, block_size: int) -> np.ndarray:
    """The block_size uint32 words a page key is looked up by."""
    words = []
    data = (salt + "\0" + key).encode()
    for counter in itertools.count():
        person = counter.to_bytes(16, "little")
        digest = hashlib.blake2b(data, digest_size=64, person=person).digest()
        words.append(np.frombuffer(digest, dtype="<u4"))
        if 16 * (counter + 1) >= block_size:
            break
    return np.concatenate(words)[:block_size].astype(np.uint32)


def _host_pool_layers(pool: Any) -> list[tuple[Any, Any]]:
    """Per layer (K, V) views [pages, page_size, heads, head_dim] of an
    MHA host pool's kv_buffer, in the pool's layout."""
    buf = pool.kv_buffer
    layers, page_size = pool.layer_num, pool.page_size
    heads, head_dim = buf.shape[-2], buf.shape[-1]
    layout = getattr(pool, "layout", "layer_first")
    if layout == "layer_first":  # [2, layers, tokens, heads, head_dim]
        planes = [[buf[p, l] for l in range(layers)] for p in (0, 1)]
    elif layout == "page_first":  # [2, tokens, layers, heads, head_dim]
        planes = [[buf[p, :, l] for l in range(layers)] for p in (0, 1)]
    elif layout == "page_first_direct":
        # [2, pages, layers, page_size, heads, head_dim]
        return [(buf[0, :, l], buf[1, :, l]) for l in range(layers)]
    else:
        raise ValueError(
            f"host pool layout {layout!r} is not one tierkv registers "
            "(layer_first, page_first, page_first_direct)")
    pages = planes[0][0].shape[0] // page_size
    return [(planes[0][l][:pages * page_size].view(pages, page_size, heads,
                                                   head_dim),
             planes[1][l][:pages * page_size].view(pages, page_size, heads,
                                                   head_dim))
            for l in range(layers)]


class TierkvStorage(HiCacheStorage):
    """HiCache's storage tier in tierkvd (see the module doc).

    Constructed by SGLang's backend factory as TierkvStorage(storage_config,
    kwargs); SGLang then calls register_mem_pool_host with the host pool.
    Extra config keys: socket, model (default: SGLang's model name; must
    match tierkvd --model), tenant, name, call_timeout and
    reconnect_wait (seconds: after a failed attach, how long calls are
    misses before the next try; doubles per failure up to 30 s; default 1).

    How long one batch call waits for its copies, in seconds: a get,
    get_timeout_base + get_timeout_per_ki_token per 1024 tokens of the
    batch (default 1 + 0.25, SGLang's default prefetch timeout: set them
    as SGLang's prefetch_timeout_base and prefetch_timeout_per_ki_token);
    a set, batch_timeout (default 60; a get too when it is given alone).
    The pages whose copies finished by then are served or stored; the rest
    are misses, and the call returns once no copy of them still runs.
    HiCache splits a prefetch into calls of storage_batch_size pages and
    counts its timeout from when it queued the prefetch, so a prefetch of
    several calls may take longer than HiCache waits for it. Under
    SGLang's wait_complete prefetch policy HiCache waits for every page:
    give batch_timeout there, so that pages slow to come from disk are
    waited for rather than recomputed.
    """

    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None
                 ) -> None:
        self._storage_config = storage_config
        extra = dict(config_value(storage_config, "extra_config", None) or {})
        if config_value(storage_config, "is_mla_model", False):
            raise ValueError("tierkv's SGLang backend stores MHA KV (K and V "
                             "per layer); this model uses MLA")
        if not bool(extra.get("interface_v1", 0)):
            # SGLang's own test: without it, HiCache calls batch_get and
            # batch_set, which this backend does not have, on its prefetch
            # and backup threads, and each thread ends at its first call.
            raise ValueError(
                "tierkv's SGLang backend copies pages through the host pool: "
                "set \"interface_v1\": 1 in "
                "--hicache-storage-backend-extra-config")
        self._socket = str(extra.get("socket", DEFAULT_SOCKET))
        model = extra.get("model")
        if model is None:
            model = config_value(storage_config, "model_name", "") or ""
        self._model = str(model)
        self._tenant = str(extra.get("tenant", ""))
        self._name = str(extra.get("name", ""))
        self._call_timeout = float(extra.get("call_timeout", 5.0))
        self._batch_timeout = float(extra.get("batch_timeout",
                                              DEFAULT_BATCH_TIMEOUT))
        # A batch_timeout given alone bounds gets too, as it always has.
        self._get_timeout_fixed = (
            "batch_timeout" in extra and "get_timeout_base" not in extra
            and "get_timeout_per_ki_token" not in extra)
        self._get_timeout_base = float(extra.get("get_timeout_base",
                                                 DEFAULT_GET_TIMEOUT_BASE))
        self._get_timeout_per_ki_token = float(extra.get(
            "get_timeout_per_ki_token", DEFAULT_GET_TIMEOUT_PER_KI_TOKEN))
        for name, value in (("batch_timeout", self._batch_timeout),
                            ("get_timeout_base", self._get_timeout_base),
                            ("get_timeout_per_ki_token",
                             self._get_timeout_per_ki_token)):
            if not 0 <= value < float("inf"):
                raise ValueError(f"tierkv's SGLang backend: extra config "
                                 f"'{name}' must be a number of seconds, at "
                                 f"least 0, not {value}")
        # Each try to attach may take call_timeout, in HiCache's threads.
        self._retry = Backoff(
            max(0.0, float(extra.get("reconnect_wait", 1.0))),
            clock=lambda: time.monotonic())
        tp_rank = int(config_value(storage_config, "tp_rank", 0))
        tp_size = int(config_value(storage_config, "tp_size", 1))
        self._salt = f"tp{tp_rank}/{tp_size}"
        pp_size = int(config_value(storage_config, "pp_size", 1) or 1)
        if pp_size > 1:
            self._salt += "/pp%d/%d" % (
                int(config_value(storage_config, "pp_rank", 0)), pp_size)
        # Context-parallel ranks of one attention-TP rank hold disjoint
        # slices of every page under the same tp_rank.
        cp_size = int(config_value(storage_config, "attn_cp_size", 1) or 1)
        if cp_size > 1:
            self._salt += "/cp%d/%d" % (
                int(config_value(storage_config, "attn_cp_rank", 0)), cp_size)
        # What keys are derived under: the rank's salt, and after a clear
        # its generation (see clear). Swapped whole, without the lock.
        self._key_salt = self._salt
        self._lock = threading.Lock()
        self._client: Any = None
        self._device: Any = None  # The host pool, once registered.
        self._layout: Any = None
        self._page_size = 0
        self._next_request = 1
        # Calls failed for want of tierkvd (_degraded), and batches that
        # gave up late copies (_late).
        self._failed_calls = _Throttled()
        self._late_batches = _Throttled()

    # -- set-up ---------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host pool as this backend's device memory and
        attaches to tierkvd; a tierkvd that cannot be reached yet is
        attached to by a later call (SGLang starts without it)."""
        super().register_mem_pool_host(mem_pool_host)
        buf = mem_pool_host.kv_buffer
        self._page_size = int(mem_pool_host.page_size)
        if self._page_size < MIN_PAGE_SIZE:
            # A page's key words are all that tells two pages apart.
            raise ValueError(
                f"tierkv's SGLang backend needs pages of at least "
                f"{MIN_PAGE_SIZE} tokens ({32 * MIN_PAGE_SIZE} bits of key); "
                f"this host pool's page_size is {self._page_size}: run SGLang "
                f"with --page-size {MIN_PAGE_SIZE} or more")
        self._layout = tierkv.KvLayout(
            num_layers=int(mem_pool_host.layer_num),
            num_kv_heads=int(buf.shape[-2]),
            head_dim=int(buf.shape[-1]),
            block_size=self._page_size,
            dtype=layout_dtype(getattr(mem_pool_host, "dtype", buf.dtype)))
        device = tierkv.RegisteredDevice.from_layers(
            self._layout, _host_pool_layers(mem_pool_host))
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
            self._device = device
            self._retry.reset()
            try:
                self._attach()
            except _TRANSIENT as e:
                self._degraded("attach", e)

    def register_mem_host_pool_v2(self, host_pool: Any,
                                  host_pool_name: Any) -> None:
        """SGLang's registration of each host pool of a hybrid model's
        HiCache (its hybrid cache controller), the KV pool's included:
        refused at start, since that controller then calls batch_exists_v2
        and batch_set_v2, which this backend does not have, and each of its
        storage threads would end at its first call."""
        name = getattr(host_pool_name, "value", host_pool_name)
        raise ValueError(
            f"tierkv's SGLang backend serves HiCache's plain KV host pool "
            f"(batch_exists, batch_get_v1, batch_set_v1); this model's "
            f"HiCache registers its pools one by one (here {name!r}: a "
            "hybrid or draft model's): run it without the tierkv storage "
            "backend")

    def _attach(self) -> Any:
        """Opens the client, or attaches the lost one again; a failure
        puts the next try off (reconnect_wait)."""
        try:
            if self._client is None:
                self._client = tierkv.Client.open(
                    self._socket, self._layout, model=self._model,
                    tenant=self._tenant,
                    name=self._name or f"sglang-{self._salt}",
                    device=self._device, call_timeout=self._call_timeout)
            else:
                self._client.reconnect()
        except tierkv.Error:
            self._retry.failed()
            raise
        self._retry.reset()
        return self._client

    @property
    def client(self) -> Any:
        return self._client

    def _ready(self) -> Any:
        """The attached client (attached again after a lost tierkvd)."""
        if self._device is None:
            raise tierkv.FailedPreconditionError(
                "register_mem_pool_host was not called: the backend has no "
                "host pool to copy into")
        if self._client is not None and self._client.connected:
            return self._client
        if not self._retry.due():
            raise tierkv.UnavailableError(
                f"not attached to tierkvd on {self._socket}: the last try "
                f"failed; the next in {self._retry.left():.1f} s")
        try:
            return self._attach()
        except tierkv.Error as e:
            if isinstance(e, _TRANSIENT):
                raise
            # A tierkvd that refuses this backend (another model or layout,
            # permissions): raised, it would end HiCache's thread for good;
            # a miss, logged, until tierkvd is one that accepts it.
            raise tierkv.UnavailableError(
                f"tierkvd on {self._socket} refuses this backend: {e}") from e

    def _tokens(self, key: str) -> np.ndarray:
        return key_tokens(key, self._key_salt, self._page_size)

    def _page(self, host_indices: Any, i: int) -> int:
        return int(host_indices[i * self._page_size]) // self._page_size

    def _request(self) -> int:
        rid = self._next_request
        self._next_request += 1
        return rid

    # -- HiCacheStorage -------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many keys, from the first, tierkvd holds (host or disk); 0
        while tierkvd cannot answer."""
        return self._or_miss("batch_exists", lambda: self._exists(keys), 0)

    def _exists(self, keys: List[str]) -> int:
        client = self._ready()
        hits = 0
        for key in keys:
            rid = self._request()
            try:
                found = client.lookup_chunk(rid, self._tokens(key))
            finally:
                client.finish(rid)
            if found.hit_tokens < self._page_size:
                break
            hits += 1
        return hits

    def _or_miss(self, what: str, call, miss: Any) -> Any:
        """call() under the lock; `miss` when it fails for want of tierkvd
        (logged, at most every _WARN_EVERY seconds)."""
        with self._lock:
            try:
                return call()
            except _TRANSIENT as e:
                self._degraded(what, e)
                return miss

    def _degraded(self, what: str, error: Exception) -> None:
        failed = self._failed_calls.due()
        if failed is not None:
            logger.warning("tierkv: %s: %s (%d call(s) failed so; HiCache "
                           "goes on without tierkv until it answers)", what,
                           error, failed)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Loads each key's page into its host pool page; per key, whether
        the page now holds it (False: not stored, or its load failed)."""
        return self._or_miss(
            "batch_get_v1",
            lambda: self._batch("batch_get_v1", keys, host_indices,
                                self._start_get, self._get_timeout(len(keys))),
            [False] * len(keys))

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        """Stores each key's host pool page; per key, whether tierkvd holds
        it now (True also for a key it held already, or that another
        worker's store is writing)."""
        return self._or_miss(
            "batch_set_v1",
            lambda: self._batch("batch_set_v1", keys, host_indices,
                                self._start_set, self._batch_timeout),
            [False] * len(keys))

    def _get_timeout(self, pages: int) -> float:
        """How long a get batch of `pages` pages waits for its copies."""
        if self._get_timeout_fixed:
            return self._batch_timeout
        return (self._get_timeout_base + self._get_timeout_per_ki_token *
                pages * self._page_size / 1024)

    def _start_get(self, client: Any, rid: int, key: str, page: int
                   ) -> Optional[bool]:
        """Starts the load of `key` into `page`: None when it copies, else
        the key's result."""
        found = client.lookup_chunk(rid, self._tokens(key))
        if found.hit_tokens < self._page_size:
            return False
        try:
            alloc = client.allocate(rid, [page], self._page_size)
        except tierkv.ResourceExhaustedError:
            # The worker's loads in flight are at tierkvd's cap: this key is
            # a miss, and the loads already started still count.
            return False
        return None if alloc.load is not None or alloc.load_pending else False

    def _start_set(self, client: Any, rid: int, key: str, page: int
                   ) -> Optional[bool]:
        """Starts the store of `page` as `key`: None when it copies, else
        the key's result (True: tierkvd holds the key already, or another
        worker's store of it is under way; False: no room)."""
        found = client.lookup_chunk(rid, self._tokens(key))
        if found.hit_tokens >= self._page_size:
            # Finished now: the lookup pins the held page, and a backup of
            # many held pages would pin up to the worker's share of host
            # slots until the batch ends, leaving none for the rest.
            client.finish(rid)
            return True
        client.allocate(rid, [page], 0)
        commit = client.commit(rid, self._page_size, [page])
        if commit.stores:
            return None
        # Nothing skipped: the key needed no store. HiCache stops a backup
        # at its first False, so calling that a failure would leave the
        # rest of the backup unwritten.
        return commit.skipped_blocks == 0

    def _batch(self, what: str, keys: List[str], host_indices: Any, start,
               timeout: float) -> List[bool]:
        """start() each key's copy, then waits for them, at most `timeout`
        seconds; finishes every request. A copy's result: it succeeded,
        whole, in time. Copies still running then are given up (and waited
        for, see _abandon), and their keys are misses."""
        client = self._ready()
        results = [False] * len(keys)
        copying: dict[int, int] = {}  # request -> key index
        rids = []
        late: set[int] = set()
        try:
            for i, key in enumerate(keys):
                rid = self._request()
                rids.append(rid)
                result = start(client, rid, key,
                               self._page(host_indices, i))
                if result is None:
                    copying[rid] = i
                else:
                    results[i] = result
            late = set(copying)
            for f in self._wait(client, late, timeout):
                results[copying[f.event.request]] = (
                    f.ok and f.event.failed_blocks == 0)
            self._abandon(client, late)
        except BaseException:
            self._abandon(client, set(copying))
            raise
        finally:
            self._finish(client, rids)
        if late:
            self._late(what, len(late), len(keys), timeout)
        return results

    def _late(self, what: str, late: int, pages: int, timeout: float
              ) -> None:
        """Logs a batch whose copies were not all done in time (at most
        every _WARN_EVERY seconds): tierkvd answers, but too slowly."""
        batches = self._late_batches.due()
        if batches is not None:
            logger.warning("tierkv: %s: %d of %d page copies still running "
                           "after %.1f s; counted as misses (%d late "
                           "batch(es) since the last warning)", what, late,
                           pages, timeout, batches)

    def _wait(self, client: Any, requests: set[int], timeout: float) -> list:
        """Waits for the transfers of `requests`, at most `timeout` seconds,
        completes them and returns them; `requests` keeps those that did
        not finish."""
        done = []
        deadline = time.monotonic() + timeout
        while requests:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            finished = client.wait_events(left)
            if finished:
                client.complete(finished)
            for f in finished:
                if f.event.request in requests:
                    requests.discard(f.event.request)
                    done.append(f)
        return done

    def _abandon(self, client: Any, requests: set[int]) -> None:
        """After a failed batch, or for a batch's late copies: waits, with
        no deadline, until no copy of the batch runs any more, completing
        each as it finishes, so that no copy still reads or writes SGLang's
        host pool once the batch call returns (SGLang reuses its pages at
        once). Loads still waiting for
        promotions are cancelled (finished) first: they never start. A lost
        tierkvd ends the wait: the client waits for the copies running when
        it lost the attachment and fails the rest."""
        if not requests:
            return
        for rid in requests:
            try:
                client.finish(rid)
            except tierkv.Error:
                pass  # _finish reports what is wrong with the request.
        waited = 0.0
        while client.transfers_in_flight > 0 or client.loads_pending > 0:
            begin = time.monotonic()
            try:
                finished = client.wait_events(self._batch_timeout)
                if finished:
                    client.complete(finished)
            except tierkv.Error as e:
                logger.warning("tierkv: %s", e)
                finished = []
            if not client.connected and not finished:
                return  # It waited for its copies when it lost tierkvd.
            waited += time.monotonic() - begin
            if waited >= self._batch_timeout:
                logger.error("tierkv: %d page copies of a given-up batch "
                             "still running after %.0f s; waiting for "
                             "them", client.transfers_in_flight, waited)
                waited = 0.0

    def _finish(self, client: Any, rids: list[int]) -> None:
        for rid in rids:
            try:
                client.finish(rid)
            except tierkv.Error as e:
                if e.code != "NOT_FOUND":  # Its lookup never happened.
                    logger.warning("tierkv: finish: %s", e)

    # The value-based interface: HiCache uses batch_get_v1 / batch_set_v1
    # when the extra config says "interface_v1": 1.

    def _no_values(self) -> None:
        raise NotImplementedError(
            "tierkv's SGLang backend copies pages through the host pool: set "
            "\"interface_v1\": 1 in --hicache-storage-backend-extra-config")

    def get(self, key: str, target_location: Any = None,
            target_sizes: Any = None) -> Any:
        self._no_values()

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        self._no_values()

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        self._no_values()
        return False

    def batch_set(self, keys: List[str], values: Any = None,
                  target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        self._no_values()
        return False

    def clear(self) -> None:
        """SGLang's clear of HiCache's storage (its clear_hicache_storage
        endpoint, after new weights): nothing stored before is found by
        this rank again. Nothing is deleted: tierkvd's store is shared with
        engines that may still run the old weights (an operator clears it
        with tierkv-admin, which a worker client may not do), and a backup
        in flight would land after a delete. Instead the rank derives its
        keys under a fresh generation, drawn at random, from now on. Earlier
        pages age out of the tiers. Called on SGLang's scheduler thread, it
        does not wait for the lock (a batch holds it while its copies run):
        a batch under way goes on, its keys past the swap under the new
        generation."""
        generation = uuid.uuid4().hex
        self._key_salt = f"{self._salt}/gen{generation}"
        logger.info("tierkv: HiCache storage cleared for this rank: its "
                    "pages are keyed under generation %s from now on "
                    "(tierkvd's store itself is left as it is)", generation)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
