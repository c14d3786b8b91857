"""tierkv as a vLLM KV connector (vLLM's V1 KV-connector interface).

Select it with::

    --kv-transfer-config '{"kv_connector": "TierkvConnector",
        "kv_connector_module_path": "tierkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/tierkv/tierkvd.sock"}}'

kv_load_failure_policy "recompute" is required where vLLM has the setting:
under its default, "fail", every load tierkv cannot complete (tierkvd
restarted, a disk read failed, a cap refused the allocation) would end the
user's request with an error instead of computing its tokens. The model's
layers must be full attention, in one KV cache group: a sliding-window
group hands out-of-window blocks as vLLM's null block, whose bytes would be
stored as the prefix's KV.

vLLM makes one connector in its scheduler process (role SCHEDULER) and one in
each worker process, one worker per tensor-parallel rank (role WORKER). The
scheduler's connector holds a tierkv scheduler client (copies="ranks",
ranks = the tensor-parallel size): it looks prompts up, allocates loads,
commits computed blocks and finishes requests, and copies nothing. Each
worker's connector holds a rank client over the worker's own KV cache
tensors (its shard of the KV heads) that runs the copies of the events the
scheduler hands out in the connector metadata; tierkvd completes an event
once every rank has.

Flow per request (vLLM's calls in brackets):
  [get_num_new_matched_tokens] Lookup: the hit, loaded asynchronously.
  [update_state_after_alloc]   Allocate: a load event (or a pending one that
                               waits for promotions from tierkvd's disk tier).
  [build_connector_meta]       Commit of the tokens this step computes (store
                               events), the loads to start, what workers must
                               report; plain picklable data.
  worker [start_load_kv]       starts this rank's copies of the loads; their
                               requests are not in the batch (they wait for
                               their KV), so [wait_for_layer_load] returns at
                               once: loads are whole blocks, never per layer.
  worker [wait_for_save]       after the forward: starts the step's stores
                               and waits for their copies, so no block is
                               written again while a store reads it.
  worker [get_finished]        requests whose loads on this rank are done
                               (finished_recving), and finished requests whose
                               stores on this rank are done (finished_sending).
  worker [get_block_ids_with_load_errors]
                               device blocks of loads that failed or were cut
                               short; vLLM recomputes from the first of them.
  [request_finished]           Finish; frees late (True) while the request's
                               stores may still be copying.
  [reset_cache]                After new weights (reset_prefix_cache with
                               the connector's cache): what was cached before
                               is never served to this engine again.

The classes import without vLLM: they subclass vLLM's KVConnectorBase_V1
when it can be imported, and a local stand-in with the same methods when it
cannot (tests, and engines that drive the connector themselves).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import logging
import time
import uuid
from typing import Any, Iterable, Optional

import tierkv
from tierkv._engines import Backoff, config_value, layout_dtype

logger = logging.getLogger(__name__)

try:  # vLLM's interface when vLLM is installed.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM = True
except ImportError:  # The same surface, for use without vLLM.
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """Where a connector runs: vLLM's scheduler or one of its workers."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """What the scheduler's connector sends its workers each step."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """The part of vLLM's KVConnectorBase_V1 tierkv's connector uses."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole,
                     kv_cache_config: Any = None) -> None:
            self._vllm_config = vllm_config
            self._kv_transfer_config = getattr(vllm_config,
                                               "kv_transfer_config", None)
            if self._kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for a KV "
                                 "connector")
            self._kv_cache_config = kv_cache_config
            self._role = role
            self._connector_metadata: Optional[KVConnectorMetadata] = None

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        def bind_connector_metadata(self,
                                    metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


DEFAULT_SOCKET = "/run/tierkv/tierkvd.sock"
# How long wait_for_save waits for the step's store copies. Default: 60 s.
DEFAULT_SAVE_TIMEOUT = 60.0
# How long a load may wait for promotions before it is given up. Default:
# 30 s.
DEFAULT_LOAD_TIMEOUT = 30.0
_LOST = (tierkv.UnavailableError, tierkv.DeadlineExceededError)

# Events one Client.decline reports at most (a message's cap is far above).
_DECLINES_PER_CALL = 1024

# The scheduler's first wait between tries to attach again (reconnect_wait).
_RETRY_FIRST_S = 1.0


def _backoff(first: float) -> Backoff:
    # The clock read through this module, so a test can move it.
    return Backoff(first, clock=lambda: time.monotonic())


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class TierkvConfig:
    """The connector's settings, from kv_connector_extra_config and vLLM.

    Extra config keys: socket (default /run/tierkv/tierkvd.sock), model
    (default: the model vLLM serves; must match tierkvd --model), tenant,
    name, call_timeout and save_timeout (seconds; wait_for_save logs an
    error each save_timeout it waits for stores, and goes on waiting),
    reconnect_wait (seconds the scheduler waits before it tries to attach
    again once an attach failed, doubling per failure up to 30; default 1),
    load_timeout (seconds a load may wait for tierkvd's promotions from its
    disk or remote tier before it is given up and the request computes its
    tokens; default 30, 0 for no limit), and, to override what is
    derived from vLLM's model and cache configs: num_layers, num_kv_heads
    (all of the model's, every rank's), head_dim, block_size, dtype, tp_size,
    rank (a worker's tensor-parallel rank, for engines without vLLM), and
    kv_layout: "paged" (per layer [2, num_blocks, block_size, heads,
    head_dim], FlashAttention's) or "flashinfer" ([num_blocks, 2, ...]);
    by default told from the tensors' shape, which a cache of 2 blocks
    leaves ambiguous (then naming it is required); copy_engine: "tierkv"
    (tierkv's copy engine over registered host memory), "torch" (torch
    copies through the host slots, for tensors on any device, a GPU's
    included) or "auto" (the default: tierkv for tensors in host memory,
    torch otherwise).
    """

    socket: str
    layout: Any  # tierkv.KvLayout
    model: str = ""
    tenant: str = ""
    name: str = ""
    call_timeout: float = 5.0
    save_timeout: float = DEFAULT_SAVE_TIMEOUT
    load_timeout: float = DEFAULT_LOAD_TIMEOUT
    reconnect_wait: float = _RETRY_FIRST_S
    tp_size: int = 1
    rank: Optional[int] = None
    kv_layout: str = ""  # "paged", "flashinfer" or "" (from the shape).
    copy_engine: str = "auto"  # "auto", "tierkv" or "torch".
    # vLLM's device blocks per worker (the scheduler's block ids are below
    # it): extra config num_device_blocks, else the KV cache config's.
    num_device_blocks: int = 0

    @classmethod
    def from_vllm_config(cls, vllm_config: Any,
                         kv_cache_config: Any = None) -> "TierkvConfig":
        """Reads the settings; ValueError naming what is missing or wrong."""
        transfer = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(config_value(transfer, "kv_connector_extra_config", None)
                     or {})
        model_config = getattr(vllm_config, "model_config", None)
        cache_config = getattr(vllm_config, "cache_config", None)
        parallel = getattr(vllm_config, "parallel_config", None)
        if int(config_value(parallel, "pipeline_parallel_size", 1)) > 1:
            raise ValueError(
                "tierkv's vLLM connector supports tensor parallelism only; "
                "run with pipeline_parallel_size 1")
        policy = config_value(transfer, "kv_load_failure_policy", None)
        if policy is not None and str(policy) != "recompute":
            raise ValueError(
                f"tierkv: kv_load_failure_policy is {policy!r} (vLLM's "
                "default is \"fail\"): a load tierkv cannot complete (tierkvd "
                "restarted, a disk read failed) would fail the request "
                "instead of computing its tokens; add \"kv_load_failure_policy"
                "\": \"recompute\" to --kv-transfer-config")
        _check_full_attention(kv_cache_config)
        tp_size = int(extra.get(
            "tp_size", config_value(parallel, "tensor_parallel_size", 1)))
        layout = tierkv.KvLayout(
            num_layers=int(_from_model(extra, "num_layers", model_config,
                                       parallel)),
            num_kv_heads=int(_from_model(extra, "num_kv_heads", model_config,
                                         parallel)),
            head_dim=int(_from_model(extra, "head_dim", model_config,
                                     parallel)),
            block_size=int(extra.get(
                "block_size", config_value(cache_config, "block_size", 16))),
            dtype=_dtype(extra, model_config, cache_config))
        model = extra.get("model")
        if model is None:
            model = str(config_value(model_config, "model", "") or "")
        rank = extra.get("rank")
        kv_layout = str(extra.get("kv_layout", ""))
        if kv_layout not in ("", "paged", "flashinfer"):
            raise ValueError(f"tierkv: kv_layout {kv_layout!r} is not "
                             "\"paged\" or \"flashinfer\"")
        copy_engine = str(extra.get("copy_engine", "auto"))
        if copy_engine not in ("auto", "tierkv", "torch"):
            raise ValueError(f"tierkv: copy_engine {copy_engine!r} is not "
                             "\"auto\", \"tierkv\" or \"torch\"")
        blocks = extra.get("num_device_blocks",
                           config_value(kv_cache_config, "num_blocks", None))
        if blocks is None:
            blocks = config_value(cache_config, "num_gpu_blocks", 0)
        return cls(socket=str(extra.get("socket", DEFAULT_SOCKET)),
                   layout=layout,
                   model=str(model),
                   tenant=str(extra.get("tenant", "")),
                   name=str(extra.get("name", "")),
                   call_timeout=float(extra.get("call_timeout", 5.0)),
                   load_timeout=max(0.0, float(extra.get(
                       "load_timeout", DEFAULT_LOAD_TIMEOUT))),
                   save_timeout=float(extra.get("save_timeout",
                                                DEFAULT_SAVE_TIMEOUT)),
                   reconnect_wait=max(0.0, float(extra.get(
                       "reconnect_wait", _RETRY_FIRST_S))),
                   tp_size=tp_size,
                   rank=None if rank is None else int(rank),
                   kv_layout=kv_layout,
                   copy_engine=copy_engine,
                   num_device_blocks=int(blocks or 0))


def _check_full_attention(kv_cache_config: Any) -> None:
    """Refuses KV cache groups the connector would store wrong KV from: it
    reads the first group's block ids only, and stores a request's blocks
    from its first, as a full-attention prefix. A sliding-window (or chunked
    local attention) group hands blocks out of the window as vLLM's null
    block (id 0, whatever was last written there); a state-space group's
    blocks are not per token at all. Names are matched through the spec's
    classes, so vLLM need not be importable."""
    groups = list(config_value(kv_cache_config, "kv_cache_groups", None) or ())
    if len(groups) > 1:
        raise ValueError(
            f"tierkv: {len(groups)} KV cache groups (a hybrid model under "
            "vLLM's hybrid KV cache manager); the connector serves models "
            "whose layers share one group of full-attention blocks")
    for group in groups:
        spec = config_value(group, "kv_cache_spec", None)
        if spec is None:
            continue
        names = [c.__name__ for c in type(spec).__mro__]
        if "FullAttentionSpec" not in names or any("MLA" in n for n in names):
            raise ValueError(
                f"tierkv: the model's KV cache is {type(spec).__name__}; "
                "the connector serves full-attention layers of K and V only "
                "(vLLM gives a sliding window's blocks out of the window as "
                "its null block, whose bytes would be stored as the prefix's "
                "KV; MLA keeps no K and V planes)")


def _from_model(extra: dict, key: str, model_config: Any,
                parallel: Any) -> int:
    """A layout dimension: from the extra config, else vLLM's model config."""
    if key in extra:
        return extra[key]
    getter = {
        "num_layers": lambda: model_config.get_num_layers(parallel),
        "num_kv_heads": lambda: model_config.get_total_num_kv_heads(),
        "head_dim": lambda: model_config.get_head_size(),
    }[key]
    if model_config is None:
        raise ValueError(f"no model config to read {key} from; name it in "
                         "kv_connector_extra_config")
    return getter()


def _dtype(extra: dict, model_config: Any, cache_config: Any) -> str:
    if "dtype" in extra:
        return layout_dtype(extra["dtype"])
    cache_dtype = str(config_value(cache_config, "cache_dtype", "auto"))
    if cache_dtype != "auto":
        return layout_dtype(cache_dtype)
    return layout_dtype(config_value(model_config, "dtype", "bf16"))


def _tp_rank(config: TierkvConfig) -> int:
    """This worker's tensor-parallel rank: the extra config's, else vLLM's."""
    if config.rank is not None:
        return config.rank
    if HAVE_VLLM:
        from vllm.distributed.parallel_state import (  # type: ignore
            get_tensor_model_parallel_rank)
        return int(get_tensor_model_parallel_rank())
    if config.tp_size == 1:
        return 0
    raise ValueError("without vLLM, a worker's tensor-parallel rank must be "
                     "named in kv_connector_extra_config ('rank')")


def _block_ids(blocks: Any) -> list[int]:
    """The block ids of vLLM's KVCacheBlocks (first group) or of a list."""
    if hasattr(blocks, "get_block_ids"):
        groups = blocks.get_block_ids()
        return list(groups[0]) if groups else []
    if blocks and isinstance(blocks, tuple) and isinstance(blocks[0], list):
        return list(blocks[0])
    return list(blocks or [])


def _request_tokens(request: Any) -> list[int]:
    tokens = getattr(request, "all_token_ids", None)
    if tokens is None:
        tokens = request.prompt_token_ids
    return list(tokens)


def lora_key(name: Optional[str], path: Optional[str]) -> Optional[int]:
    """The lora_id tierkv keys a vLLM LoRA adapter's blocks by: a 63-bit
    hash of its name and path (vLLM's lora_int_id is numbered per vLLM
    process, and tierkvd outlives and serves many; a name reused for other
    weights has another path). None without a name."""
    if not name:
        return None
    digest = hashlib.blake2b(f"{name}\0{path or ''}".encode(),
                             digest_size=8, person=b"tierkv-lora")
    return int.from_bytes(digest.digest(), "little") >> 1


def _generation_salt(generation: str, salt: Optional[str]) -> str:
    """The cache salt of a request looked up under a cache generation (see
    _SchedulerSide.reset_cache): a fixed 64 hex digits whatever the
    request's own salt, so a salt tierkvd takes stays one it takes."""
    data = f"{generation}\0{salt or ''}".encode()
    return hashlib.blake2b(data, digest_size=32,
                           person=b"tierkv-gen-salt").hexdigest()


def _request_extras(request: Any) -> Optional[dict[str, Any]]:
    """What besides its tokens changes the request's KV, as Client.lookup's
    keyword arguments (the keys tierkv stores and commits its blocks under,
    as vLLM's own prefix cache keys them): its LoRA adapter, its cache salt
    and its multimodal items. None when the request cannot be keyed safely
    (prompt embeddings, whose token ids say nothing of the KV, or inputs
    this connector does not know how to name): tierkv then neither serves
    nor stores it."""
    if getattr(request, "prompt_embeds", None) is not None:
        return None
    extras: dict[str, Any] = {}
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        extras["lora_id"] = lora_key(getattr(lora, "lora_name", None),
                                     getattr(lora, "lora_path", None))
        if extras["lora_id"] is None:
            return None
    salt = getattr(request, "cache_salt", None)
    if salt:
        extras["cache_salt"] = str(salt)
    items = []
    features = getattr(request, "mm_features", None)
    if features:  # vLLM 0.10.2 and later: MultiModalFeatureSpec.
        for f in features:
            position = getattr(f, "mm_position", None)
            identifier = getattr(f, "identifier", None)
            if not identifier or position is None:
                return None
            items.append((identifier, int(position.offset),
                          int(position.length)))
    else:  # Earlier releases: parallel lists of hashes and positions.
        hashes = getattr(request, "mm_hashes", None) or []
        positions = getattr(request, "mm_positions", None) or []
        if len(hashes) != len(positions):
            return None
        for identifier, position in zip(hashes, positions):
            if not identifier:
                return None
            items.append((identifier, int(position.offset),
                          int(position.length)))
    if items:
        extras["mm_items"] = items
    return extras


# ---------------------------------------------------------------------------
# Metadata: what the scheduler's connector sends its workers each step
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class LoadOp:
    """A load for every rank to copy; failed_blocks: its device blocks that
    will not be loaded (a promotion failed), for vLLM to recompute."""

    request_id: str
    event: Any  # tierkv.TransferEvent
    failed_blocks: list[int] = dataclasses.field(default_factory=list)
    epoch: str = ""  # The scheduler attachment that made the event.


@dataclasses.dataclass
class StoreOp:
    """A store for every rank to copy after the step's forward."""

    request_id: str
    event: Any  # tierkv.TransferEvent
    epoch: str = ""  # The scheduler attachment that made the event.


@dataclasses.dataclass
class FailedRecv:
    """A request vLLM waits for whose load will never be copied (cancelled,
    or tierkvd lost): workers report it received, these blocks failed."""

    request_id: str
    failed_blocks: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TierkvConnectorMetadata(KVConnectorMetadata):
    """One step's instructions for the workers; plain data, picklable."""

    scheduler: int = 0  # The scheduler client's worker id in tierkvd.
    session: int = 0  # Its attachment; a new one means a new worker id.
    # A random token the scheduler draws each time it attaches: worker ids
    # and event ids start over in a restarted tierkvd, so only the epoch
    # tells the workers which attachment an event belongs to. Empty: the
    # scheduler is not attached.
    epoch: str = ""
    loads: list[LoadOp] = dataclasses.field(default_factory=list)
    stores: list[StoreOp] = dataclasses.field(default_factory=list)
    failed_recvs: list[FailedRecv] = dataclasses.field(default_factory=list)
    # Finished requests whose block freeing waits for their stores: each
    # worker reports them in finished_sending once its copies are done.
    delayed: list[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------
# Scheduler side
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Request:
    """The scheduler connector's state of one vLLM request."""

    tid: Optional[int] = None  # tierkv's request id in this session.
    num_computed: int = 0  # vLLM's local hit at the last lookup.
    allocated: bool = False
    block_ids: list[int] = dataclasses.field(default_factory=list)
    recving: bool = False  # vLLM waits for finished_recving.
    pending: bool = False  # Its load waits for promotions in tierkvd.
    pending_since: float = 0.0  # When it began to (time.monotonic).
    load_blocks: list[int] = dataclasses.field(default_factory=list)
    stores_issued: bool = False
    finished: bool = False
    # Loads allocated to the request, over its preemptions and failed loads.
    loads_offered: int = 0
    # Full blocks of the tokens it was looked up with (the most a commit
    # can store), and of them those a commit covered.
    keyed_blocks: int = 0
    committed_blocks: int = 0
    # The cache generation it was looked up under (see reset_cache).
    generation: str = ""


# Loads allocated to one request at most. vLLM looks a request up again after
# a preemption, and after a load that failed from its first block: a load
# that fails every time (a rank that cannot attach, a copy that keeps
# failing) would otherwise be offered again forever and the request never
# run. Past the cap the request computes its tokens (and stores them).
_MAX_LOADS_PER_REQUEST = 2


class _SchedulerSide:
    """Decisions for vLLM's scheduler: a tierkv client with copies="ranks"."""

    def __init__(self, config: TierkvConfig) -> None:
        self._config = config
        self._client: Any = None
        self._connected = False
        self._epoch = ""  # Drawn anew at each attachment; see the metadata.
        self._generation = ""  # Drawn anew by each reset_cache; see there.
        self._requests: dict[str, _Request] = {}
        self._by_tid: dict[int, str] = {}
        self._next_tid = 1
        self._loads: list[LoadOp] = []
        self._failed_recvs: list[FailedRecv] = []
        self._delayed: list[str] = []
        # Each try to attach may take call_timeout, on vLLM's scheduling path.
        self._retry = _backoff(config.reconnect_wait)
        self._ensure_connected(starting=True)

    @property
    def client(self) -> Any:
        return self._client

    # -- tierkvd calls ------------------------------------------------------

    def _call(self, what: str, fn, *args, **kwargs) -> Any:
        """fn(*args, **kwargs); None (logged) when it fails. A lost tierkvd
        ends the attachment's requests (see _lose)."""
        try:
            return fn(*args, **kwargs)
        except _LOST as e:
            logger.warning("tierkv: %s: %s; requests go on without tierkv "
                           "until it answers again", what, e)
            self._lose()
        except tierkv.Error as e:
            logger.warning("tierkv: %s: %s", what, e)
        return None

    def _lose(self) -> None:
        """The attachment is over (tierkvd lost, or it ended the attachment
        when a rank was lost): loads not handed out will never be copied,
        nothing more is stored for its requests."""
        self._connected = False
        if self._client is not None:
            # Its requests' pins go now (a tierkvd that ended the
            # attachment still holds them until the socket closes).
            self._client.close()
            self._client = None
        for rid, req in self._requests.items():
            if req.pending:
                self._failed_recvs.append(FailedRecv(rid, req.load_blocks))
                req.pending = False
            req.tid = None
        self._by_tid.clear()

    def _ensure_connected(self, starting: bool = False) -> bool:
        """Attaches (again) when not attached, at most once per retry wait
        (doubling from 1 s to 30 s while tries fail). A tierkvd that does
        not answer leaves the scheduler running without tierkv. A
        configuration tierkvd refuses (layout, model, permissions) raises
        while vLLM starts; later (a tierkvd restarted with another
        configuration) it is logged, and vLLM runs on without tierkv."""
        if self._connected:
            return True
        if not self._retry.due():
            return False
        if self._config.num_device_blocks < 1:
            raise ValueError(
                "tierkv: the number of vLLM's device blocks is not known (no "
                "KV cache config); name it in kv_connector_extra_config "
                "('num_device_blocks')")
        # Each attachment is a new client tagged with its epoch, which tierkvd
        # checks against the tag its ranks name (_WorkerSide._open).
        epoch = uuid.uuid4().hex
        try:
            client = tierkv.Client.open(
                self._config.socket, self._config.layout,
                self._config.num_device_blocks,
                model=self._config.model, tenant=self._config.tenant,
                name=self._config.name or "vllm-scheduler",
                copies="ranks", ranks=self._config.tp_size, attachment_tag=epoch,
                call_timeout=self._config.call_timeout)
        except tierkv.Error as e:
            if starting and not isinstance(e, _LOST):
                raise
            logger.warning("tierkv: cannot attach to tierkvd on %s: %s; "
                           "trying again in %.0f s", self._config.socket, e,
                           self._retry.wait)
            self._retry.failed()
            return False
        self._client = client
        self._retry.reset()
        self._connected = True
        self._epoch = epoch
        logger.info("tierkv: scheduler attached as worker %d (epoch %s)",
                    self._client.worker_id, self._epoch)
        return True

    def _new_tid(self, rid: str, req: _Request) -> int:
        if req.tid is not None:
            self._by_tid.pop(req.tid, None)
        req.tid = self._next_tid
        self._next_tid += 1
        self._by_tid[req.tid] = rid
        return req.tid

    def _forget(self, rid: str) -> None:
        req = self._requests.pop(rid, None)
        if req is not None and req.tid is not None:
            self._by_tid.pop(req.tid, None)

    # -- vLLM's scheduler calls ----------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int
                                   ) -> tuple[Optional[int], bool]:
        rid = request.request_id
        req = self._requests.get(rid)
        loads_offered = 0
        if req is not None and req.allocated:
            # Preempted and resumed, or its load failed: its old blocks are
            # gone; start over.
            if req.tid is not None and self._connected:
                self._call("finish", self._client.finish, req.tid)
            self._forget(rid)
            loads_offered = req.loads_offered
            req = None
        if req is None:
            req = self._requests[rid] = _Request(loads_offered=loads_offered)
        if not self._connected:  # build_connector_meta attaches again.
            return 0, False
        extras = _request_extras(request)
        if extras is None:
            # Not keyed, so never served nor stored: no tierkv request (no
            # allocation, no commit).
            return 0, False
        if self._generation:
            extras["cache_salt"] = _generation_salt(
                self._generation, extras.get("cache_salt"))
        if req.tid is None:
            self._new_tid(rid, req)
        req.generation = self._generation
        req.num_computed = num_computed_tokens
        tokens = _request_tokens(request)
        req.keyed_blocks = len(tokens) // self._config.layout.block_size
        result = self._call("lookup", self._client.lookup, req.tid, tokens,
                            num_computed_tokens, **extras)
        hit = result.hit_tokens if result is not None else 0
        if getattr(request, "skip_reading_prefix_cache", False):
            # vLLM computes every prompt token of such a request (prompt
            # logprobs, token-level pooling): its blocks are stored, never
            # served.
            return 0, False
        if hit > 0 and req.loads_offered >= _MAX_LOADS_PER_REQUEST:
            logger.warning(
                "tierkv: request %s was given %d loads already; it computes "
                "its tokens instead", rid, req.loads_offered)
            return 0, False
        return hit, hit > 0

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        req = self._requests.get(rid)
        if req is None:
            return
        block_ids = _block_ids(blocks)
        if req.allocated:  # vLLM's second call, once the load is done.
            if len(block_ids) > len(req.block_ids):
                req.block_ids = block_ids
            return
        req.allocated = True
        req.block_ids = block_ids
        bs = self._config.layout.block_size
        first = req.num_computed // bs
        used = -(-num_external_tokens // bs)
        req.load_blocks = block_ids[first:first + used]
        if num_external_tokens > 0:
            req.recving = True
            # Counted once vLLM allocates the load: a lookup vLLM could not
            # schedule (no free blocks yet) is asked again and costs none.
            req.loads_offered += 1
        if req.tid is None or not self._connected:
            if req.recving:
                self._failed_recvs.append(FailedRecv(rid, req.load_blocks))
            return
        result = self._call("allocate", self._client.allocate, req.tid,
                            block_ids, num_external_tokens)
        if result is None:
            # Not allocated in tierkv: nothing to commit. Its request there
            # is finished (the lookup's pins go, and it stops counting
            # against the worker's request cap) and forgotten here.
            self._end_tierkv_request(req)
            if req.recving:
                self._failed_recvs.append(FailedRecv(rid, req.load_blocks))
            return
        if result.load_pending:  # take_ready_loads hands it out later.
            req.pending = True
            req.pending_since = time.monotonic()
        elif result.load is not None:
            self._loads.append(self._load_op(rid, req, result.load))
        elif req.recving:
            self._failed_recvs.append(FailedRecv(rid, req.load_blocks))

    def _end_tierkv_request(self, req: _Request) -> None:
        """Finishes the request's tierkv request (its pins go, a load it
        waits for is cancelled) and forgets its id; the vLLM request stays
        known here."""
        if self._connected:
            self._call("finish", self._client.finish, req.tid)
        self._by_tid.pop(req.tid, None)
        req.tid = None

    def _load_op(self, rid: str, req: _Request, event: Any) -> LoadOp:
        # A load cut short holds its first blocks only.
        return LoadOp(rid, event, req.load_blocks[len(event.device_blocks):],
                      epoch=self._epoch)

    def build_connector_meta(self, scheduler_output: Any
                             ) -> TierkvConnectorMetadata:
        if self._connected or self._ensure_connected():
            self._take_ready_loads()
        self._give_up_slow_loads()
        stores = self._commit_scheduled(scheduler_output)
        meta = TierkvConnectorMetadata(
            scheduler=self._client.worker_id if self._connected else 0,
            session=self._client.session if self._connected else 0,
            epoch=self._epoch if self._connected else "",
            loads=self._loads, stores=stores,
            failed_recvs=self._failed_recvs, delayed=self._delayed)
        self._loads, self._failed_recvs, self._delayed = [], [], []
        return meta

    def _take_ready_loads(self) -> None:
        events = self._call("take_ready_loads",
                            self._client.take_ready_loads) or []
        for event in events:
            rid = self._by_tid.get(event.request)
            req = self._requests.get(rid) if rid is not None else None
            if req is None:
                logger.warning("tierkv: a ready load of unknown request %d",
                               event.request)
                continue
            req.pending = False
            self._loads.append(self._load_op(rid, req, event))

    def _give_up_slow_loads(self) -> None:
        """Gives up each load still waiting for promotions after
        load_timeout (a disk or remote tier that stopped answering): its
        request is finished in tierkvd, which cancels the load, and the
        load reported failed, so vLLM computes the tokens instead of
        holding the request in WAITING_FOR_REMOTE_KVS for ever."""
        timeout = self._config.load_timeout
        if timeout <= 0:
            return
        now = time.monotonic()
        for rid, req in list(self._requests.items()):
            if not req.pending or now - req.pending_since < timeout:
                continue
            logger.warning("tierkv: request %s waited %.0f s for its load "
                           "(promotions from tierkvd's lower tiers); it "
                           "computes its tokens instead", rid,
                           now - req.pending_since)
            # Not offered again: the tier that did not answer would hold a
            # new load as long. (Its blocks computed from here are not
            # stored: its tierkv request ends with the load.)
            req.loads_offered = _MAX_LOADS_PER_REQUEST
            self._give_up_pending_load(rid, req)

    def _give_up_pending_load(self, rid: str, req: _Request) -> None:
        """Ends a load still waiting for promotions: its tierkv request is
        finished (tierkvd cancels the load) and the load reported failed,
        so vLLM computes the request's tokens."""
        req.pending = False
        if req.tid is not None:
            self._end_tierkv_request(req)
        self._failed_recvs.append(FailedRecv(rid, req.load_blocks))

    def _commit_scheduled(self, out: Any) -> list[StoreOp]:
        """Commits each scheduled request's tokens computed by this step."""
        scheduled = dict(getattr(out, "num_scheduled_tokens", {}) or {})
        stores: list[StoreOp] = []
        for new in getattr(out, "scheduled_new_reqs", []) or []:
            req = self._requests.get(new.req_id)
            if req is not None:
                req.block_ids = _block_ids(new.block_ids)
                self._commit(new.req_id, req, new.num_computed_tokens +
                             scheduled.get(new.req_id, 0), stores)
        cached = getattr(out, "scheduled_cached_reqs", None)
        if cached is None:
            return stores
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        flags = getattr(cached, "resumed_from_preemption", None)
        for i, rid in enumerate(cached.req_ids):
            req = self._requests.get(rid)
            if req is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                ids = _block_ids(new_ids)
                if rid in resumed or (flags is not None and flags[i]):
                    req.block_ids = ids
                else:
                    req.block_ids = req.block_ids + ids
            self._commit(rid, req, cached.num_computed_tokens[i] +
                         scheduled.get(rid, 0), stores)
        return stores

    def _commit(self, rid: str, req: _Request, computed: int,
                stores: list[StoreOp]) -> None:
        if not req.allocated or req.tid is None or not self._connected:
            return
        if req.generation != self._generation:
            # Looked up before a cache reset: what it computes from now on
            # is of the new weights, and its keys are the old ones.
            return
        # Only a step that completes a block of the tokens it was looked up
        # with has anything to store: a decode step costs no round trip.
        blocks = min(computed // self._config.layout.block_size,
                     req.keyed_blocks)
        if blocks <= req.committed_blocks:
            return
        result = self._call("commit", self._client.commit, req.tid, computed,
                            req.block_ids)
        if result is None:
            return  # Asked again next step.
        # Blocks it skipped (caps) are not stored later: tierkvd goes on from
        # the blocks this commit covered.
        req.committed_blocks = blocks
        for event in result.stores:
            stores.append(StoreOp(rid, event, epoch=self._epoch))
            req.stores_issued = True

    def update_connector_output(self, output: Any) -> None:
        for rid in getattr(output, "finished_recving", None) or ():
            req = self._requests.get(rid)
            if req is not None:
                req.recving = False
                if req.finished:
                    self._forget(rid)
        for rid in getattr(output, "finished_sending", None) or ():
            self._forget(rid)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, Optional[dict[str, Any]]]:
        rid = request.request_id
        req = self._requests.get(rid)
        if req is None:
            return False, None
        req.finished = True
        if req.tid is not None and self._connected:
            # Also cancels a load still waiting for promotions.
            self._call("finish", self._client.finish, req.tid)
        if req.recving:
            # vLLM keeps the blocks until the workers report the request
            # received; a load that will never be copied is reported so.
            if req.pending:
                self._failed_recvs.append(FailedRecv(rid))
                req.pending = False
            return False, None
        if req.stores_issued:
            self._delayed.append(rid)
            return True, None
        self._forget(rid)
        return False, None

    def reset_cache(self) -> bool:
        """vLLM's reset_prefix_cache with the connector's cache (after an RL
        weight update, or an operator's reset): nothing cached before may be
        served to this engine again. Nothing is deleted: tierkvd's store is
        shared with engines that may still run the old weights, and a store
        in flight would land after any delete. Instead every lookup from now
        on keys its request under a fresh generation, drawn at random and
        mixed into the cache salt, which no block stored before carries. A
        request looked up before stores nothing more: its keys are the old
        ones, and what it computes from now on is of the new weights.
        Earlier blocks age out of the tiers. A load still waiting for
        promotions is given up (reported failed: vLLM computes its tokens);
        one the workers copy already completes, as vLLM's own reset fails
        while a request holds blocks. True: the reset is done."""
        self._generation = uuid.uuid4().hex
        for rid, req in self._requests.items():
            if req.pending:
                self._give_up_pending_load(rid, req)
        logger.info("tierkv: cache reset; requests are keyed under "
                    "generation %s from now on", self._generation)
        return True

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


class _WorkerSide:
    """Copies for one vLLM worker: a rank client over its KV cache tensors.

    Attaches per scheduler epoch (the metadata names the scheduler client
    and the epoch it drew when it attached, that client's attachment tag
    in tierkvd), and only to the client of that epoch: a restarted tierkvd
    numbers workers and events from 1 again, so the same (scheduler id,
    event id) may name another scheduler's event there. An event of an
    epoch other than the one this rank is attached for, or sent while the
    attachment for its epoch is lost or could not be made, fails here
    (loads are reported as load errors, stores are not copied). The rank
    attaches anew, with Client.open, when the metadata brings a new epoch.
    After a failed attach it tries again within the epoch at most once per
    reconnect_wait (the epoch's events wait for every rank in tierkvd), then
    copies as usual. After a lost one it waits for the next epoch (_lost).
    """

    def __init__(self, config: TierkvConfig) -> None:
        self._config = config
        self._device: Any = None  # tierkv copies: a RegisteredDevice.
        self._copier: Any = None  # Torch copies (_torch_copy.TorchCopier).
        self._rank = 0
        self._client: Any = None
        self._epoch = ""  # The scheduler epoch of the last attach attempt.
        self._past_epochs: set[str] = set()  # Never attached for again.
        # When to try attaching for this epoch again.
        self._retry = _backoff(config.reconnect_wait)
        # Events of this epoch that came while the rank was not attached.
        self._undeclined: list[Any] = []
        # This epoch's attachment was lost. tierkvd then failed this rank's
        # part of the events in flight, and ended the scheduler's attachment
        # (it has a tag): the epoch hands out no more events, and the
        # scheduler attaches anew at its next call. Metadata still on its way
        # may name the failed events, whose slots may be another event's by
        # now, so the rank copies nothing more this epoch and does not
        # attach for it again.
        self._lost = False
        # (kind, event id) -> (request id, event) of copies started here.
        self._in_flight: dict[tuple[str, int], tuple[str, Any]] = {}
        self._loads_left: dict[str, int] = {}
        self._stores_left: dict[str, int] = {}
        self._recved: set[str] = set()
        self._delayed: set[str] = set()
        self._load_errors: set[int] = set()
        self._step_stores: list[StoreOp] = []

    @property
    def client(self) -> Any:
        return self._client

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        layout = self._config.layout
        self._rank = _tp_rank(self._config)
        tensors = list(kv_caches.values())
        flashinfer = self._kv_layout(tuple(tensors[0].shape)) == "flashinfer"
        # Per layer (K, V), each [num_blocks, block_size, heads, head_dim].
        planes = ([(t[:, 0], t[:, 1]) for t in tensors] if flashinfer
                  else [(t[0], t[1]) for t in tensors])
        engine = self._config.copy_engine
        if engine == "auto":
            on_host = all(getattr(t, "device", None) is None or
                          t.device.type == "cpu" for t in tensors)
            engine = "tierkv" if on_host else "torch"
        self._device = self._copier = None
        if engine == "torch":
            from tierkv._torch_copy import TorchCopier
            self._copier = TorchCopier(layout, planes, rank=self._rank,
                                       num_ranks=self._config.tp_size)
        elif flashinfer:
            self._device = tierkv.RegisteredDevice.from_layers(
                layout, planes, rank=self._rank,
                num_ranks=self._config.tp_size)
        else:
            self._device = tierkv.RegisteredDevice.paged(
                layout, tensors, rank=self._rank,
                num_ranks=self._config.tp_size)

    def _kv_layout(self, shape: tuple) -> str:
        """"paged" or "flashinfer": the config's, else told from `shape`."""
        layout = self._config.kv_layout
        if len(shape) < 2:
            raise ValueError(f"tierkv: a KV cache tensor of shape {shape} "
                             "is not vLLM's paged layout")
        if not layout:
            if shape[0] == 2 and shape[1] == 2:
                raise ValueError(
                    f"tierkv: KV cache shape {shape} is both [2, num_blocks, "
                    "...] and [num_blocks, 2, ...]; name the layout in "
                    "kv_connector_extra_config: \"kv_layout\": \"paged\" "
                    "or \"flashinfer\"")
            layout = "flashinfer" if shape[0] != 2 else "paged"
        planes = shape[0] if layout == "paged" else shape[1]
        if planes != 2:
            raise ValueError(f"tierkv: KV cache shape {shape} is not the "
                             f"{layout!r} layout (kv_layout)")
        return layout

    # -- attachment ----------------------------------------------------------

    def _attach(self, meta: TierkvConnectorMetadata) -> bool:
        """A rank client attached for the metadata's epoch; False without
        one (then the step's events fail here)."""
        if self._device is None and self._copier is None:
            raise RuntimeError("tierkv: register_kv_caches was not called "
                               "before the first step")
        if meta.scheduler == 0 or not meta.epoch:
            return False
        if meta.epoch == self._epoch:
            if self._client is not None and not self._connected():
                logger.error("tierkv: rank %d lost its attachment; it copies "
                             "nothing until the scheduler attaches anew",
                             self._rank)
                self._detach()  # See _lost.
            # Never attached (the attach failed): tierkvd completes the
            # epoch's events once every rank has, so tried again, at most
            # once per reconnect_wait.
            if self._client is None and not self._lost and self._retry.due():
                self._open(meta)
            return self._client is not None
        if meta.epoch in self._past_epochs:
            return False  # Metadata older than the attachment.
        self._detach()
        if self._epoch:
            self._past_epochs.add(self._epoch)
        self._epoch = meta.epoch
        self._lost = False
        self._retry.reset()
        self._undeclined.clear()  # The scheduler's loss failed them.
        return self._open(meta)

    def _open(self, meta: TierkvConnectorMetadata) -> bool:
        """Attaches as a rank of the metadata's scheduler, naming its epoch:
        tierkvd refuses it, before it registers, when its worker of that id
        is not the client that drew the epoch (after a restart it numbers
        workers from 1 again, and a rank of another attachment would copy
        events this epoch's ids name elsewhere)."""
        copies = ({"copies": "caller",
                   "num_device_blocks": self._copier.num_blocks}
                  if self._copier is not None else {"device": self._device})
        try:
            self._client = tierkv.Client.open(
                self._config.socket, self._config.layout,
                model=self._config.model, tenant=self._config.tenant,
                name=self._config.name or f"vllm-rank{self._rank}",
                scheduler=meta.scheduler, rank=self._rank,
                call_timeout=self._config.call_timeout,
                attachment_tag=meta.epoch, **copies)
        except tierkv.Error as e:
            # Not found: the scheduler attached anew while this metadata
            # was on its way; failed precondition: its attachment ended.
            logger.warning("tierkv: rank %d cannot attach to scheduler %d: "
                           "%s; this step's copies fail here, and the rank "
                           "tries again in %.0f s", self._rank,
                           meta.scheduler, e, self._retry.wait)
            self._retry.failed()
            return False
        self._flush_declines()
        return True

    def _connected(self) -> bool:
        """Whether the rank client is attached (not lost, nor closed)."""
        c = self._client
        return c is not None and not c.closed and c.connected

    def _detach(self) -> None:
        """Closes the rank client; copies it had started count as failed."""
        if self._client is None:
            return
        self._client.close()
        self._client = None
        self._lost = True  # Until the next epoch: see _lost.
        # Dropping this client failed this rank's part of them in tierkvd.
        self._undeclined.clear()
        for rid, event in list(self._in_flight.values()):
            self._settle(rid, event, ok=False, loaded=0)
        self._in_flight.clear()

    # -- one step ------------------------------------------------------------

    def start_load_kv(self, meta: TierkvConnectorMetadata) -> None:
        attached = self._attach(meta)
        for failed in meta.failed_recvs:
            self._load_errors.update(failed.failed_blocks)
            self._recved.add(failed.request_id)
        self._delayed.update(meta.delayed)
        for op in meta.loads:
            self._load_errors.update(op.failed_blocks)
            self._loads_left[op.request_id] = (
                self._loads_left.get(op.request_id, 0) + 1)
            if not (attached and op.epoch == self._epoch
                    and self._start(op.request_id, op.event)):
                self._not_copied(op, attached)
        self._step_stores = list(meta.stores)
        self._flush_declines()

    def _not_copied(self, op: Any, attached: bool) -> None:
        """A load or store (LoadOp, StoreOp) this rank does not copy: failed
        here. One of this epoch that came before the rank first attached
        is declined once it is (tierkvd would wait for this rank's part of
        it for good); after a lost attachment tierkvd failed it already."""
        if not attached and op.epoch == self._epoch and not self._lost:
            self._undeclined.append(op.event)
        self._settle(op.request_id, op.event, ok=False, loaded=0)

    def _flush_declines(self) -> None:
        """Declines the events _not_copied kept, once attached."""
        if self._client is None or not self._undeclined:
            return
        events, self._undeclined = self._undeclined, []
        for i in range(0, len(events), _DECLINES_PER_CALL):
            self._decline(events[i:i + _DECLINES_PER_CALL])

    def _decline(self, events: list) -> None:
        """Reports this rank's part of `events` failed, in one round trip."""
        try:
            self._client.decline(events)
        except tierkv.Error as e:
            logger.warning("tierkv: rank %d: cannot decline %d event(s): %s",
                           self._rank, len(events), e)

    def _start(self, rid: str, event: Any) -> bool:
        if self._copier is not None:
            self._copy(rid, event)
            return True
        try:
            self._client.start(event)
        except tierkv.Error as e:
            logger.warning("tierkv: rank %d: %s of request %s not started: "
                           "%s", self._rank, event.kind, rid, e)
            return False
        self._in_flight[(event.kind, event.id)] = (rid, event)
        return True

    def _copy(self, rid: str, event: Any) -> None:
        """Torch copies: the event's copy, done before this returns, then
        completed with tierkvd and settled here. A copy that fails (a lost
        attachment, a device error) is reported failed: a store is not
        kept, a load's blocks are load errors."""
        error = None
        try:
            if event.kind == "store":
                self._copier.store(self._client, event)
            else:
                self._copier.load(self._client, event)
        except Exception as e:  # Never into vLLM's step: the copy failed.
            logger.warning("tierkv: rank %d: %s of request %s failed: %s",
                           self._rank, event.kind, rid, e)
            error = str(e) or type(e).__name__
        self._in_flight[(event.kind, event.id)] = (rid, event)
        self._collect([tierkv.FinishedTransfer(event, error,
                                               self._client.session)])

    def wait_for_save(self) -> None:
        """Starts the step's stores and returns once none of them reads
        vLLM's blocks any more: vLLM may write a block again as soon as this
        returns. Every save_timeout seconds without that, it logs an error
        and keeps waiting (returning would let vLLM overwrite blocks a copy
        still reads, and tierkvd would publish them)."""
        stores, self._step_stores = self._step_stores, []
        started = []
        for op in stores:
            self._stores_left[op.request_id] = (
                self._stores_left.get(op.request_id, 0) + 1)
            attached = self._connected()
            if (attached and op.epoch == self._epoch
                    and self._start(op.request_id, op.event)):
                started.append(("store", op.event.id))
            else:
                self._not_copied(op, attached)
        self._flush_declines()
        waited = 0.0
        while any(key in self._in_flight for key in started):
            begin = time.monotonic()
            try:
                self._collect(self._client.wait_events(
                    self._config.save_timeout))
            except tierkv.Error as e:
                # Closing waits for the copies this client runs.
                logger.warning("tierkv: rank %d: %s", self._rank, e)
                self._detach()
                return
            waited += time.monotonic() - begin
            if waited >= self._config.save_timeout and any(
                    key in self._in_flight for key in started):
                logger.error("tierkv: rank %d: stores still copying after "
                             "%.0f s; vLLM waits for them", self._rank,
                             waited)
                waited = 0.0

    def wait_for_transfers(self, timeout: float) -> None:
        """Waits up to `timeout` seconds until a copy this rank started
        finishes (at once when none is in flight); get_finished reports it.
        Not part of vLLM's interface: for engines that block between steps.
        """
        if self._client is not None and self._in_flight:
            self._collect(self._client.wait_events(timeout))

    def _collect(self, finished: list) -> None:
        """Completes finished copies with tierkvd and settles them here."""
        if not finished:
            return
        try:
            self._client.complete(finished)
        except tierkv.Error as e:
            # tierkvd fails what it never hears about; the copies' own
            # results still say what reached this rank's memory.
            logger.warning("tierkv: rank %d: complete: %s", self._rank, e)
        for f in finished:
            entry = self._in_flight.pop((f.event.kind, f.event.id), None)
            if entry is not None:
                self._settle(entry[0], entry[1], ok=f.ok,
                             loaded=f.loaded_blocks)

    def _settle(self, rid: str, event: Any, ok: bool, loaded: int) -> None:
        if event.kind == "load":
            if not ok:
                self._load_errors.update(event.device_blocks[loaded:])
            left = self._loads_left.get(rid, 1) - 1
            if left > 0:
                self._loads_left[rid] = left
            else:
                self._loads_left.pop(rid, None)
                self._recved.add(rid)
        else:
            left = self._stores_left.get(rid, 1) - 1
            if left > 0:
                self._stores_left[rid] = left
            else:
                self._stores_left.pop(rid, None)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        if self._client is not None:
            try:
                self._collect(self._client.poll_events())
            except tierkv.Error as e:
                logger.warning("tierkv: rank %d: %s", self._rank, e)
        # A delayed request is one of finished_req_ids, this step's or an
        # earlier one's: the scheduler delays it in request_finished.
        sending = {rid for rid in self._delayed
                   if rid not in self._stores_left
                   and rid not in self._loads_left}
        self._delayed -= sending
        recving, self._recved = self._recved, set()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._detach()


# ---------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------


def _base_init(self: Any, vllm_config: Any, role: Any,
               kv_cache_config: Any) -> None:
    """KVConnectorBase_V1.__init__ of the vLLM at hand (older ones take no
    kv_cache_config)."""
    params = inspect.signature(KVConnectorBase_V1.__init__).parameters
    if "kv_cache_config" in params:
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
    else:
        KVConnectorBase_V1.__init__(self, vllm_config, role)


def _is_scheduler(role: Any) -> bool:
    return getattr(role, "name", str(role)) == "SCHEDULER"


def _check_vllm_interface() -> None:
    """Refuses a vLLM whose connector interface lacks what the connector
    relies on: get_block_ids_with_load_errors, without which vLLM never
    asks for the blocks of a failed load and serves them as loaded."""
    if not HAVE_VLLM:
        return
    if not hasattr(KVConnectorBase_V1, "get_block_ids_with_load_errors"):
        raise ValueError(
            "tierkv: this vLLM's KVConnectorBase_V1 has no "
            "get_block_ids_with_load_errors, so it would use the blocks of "
            "a failed load as loaded; use a vLLM release that has it")


class TierkvConnector(KVConnectorBase_V1):
    """tierkv behind vLLM's KV-connector interface (see the module doc)."""

    def __init__(self, vllm_config: Any, role: Any,
                 kv_cache_config: Any = None) -> None:
        _check_vllm_interface()
        _base_init(self, vllm_config, role, kv_cache_config)
        self._config = TierkvConfig.from_vllm_config(vllm_config,
                                                     kv_cache_config)
        self._scheduler: Optional[_SchedulerSide] = None
        self._worker: Optional[_WorkerSide] = None
        if _is_scheduler(role):
            self._scheduler = _SchedulerSide(self._config)
        else:
            self._worker = _WorkerSide(self._config)

    @property
    def tierkv_config(self) -> TierkvConfig:
        return self._config

    @property
    def requires_kv_delivery(self) -> bool:
        """False: tierkv is a best-effort cache. vLLM recomputes a request
        preempted while a connector that requires delivery still hands its
        KV off (the default for kv_both, as for a producer); here a store
        is copied within the step that computed it (wait_for_save), so
        nothing is left to hand off, and a store lost is a later miss."""
        return False

    @property
    def tierkv_client(self) -> Any:
        """The tierkv client of this side (a worker's: None until the first
        metadata attaches it)."""
        side = self._scheduler or self._worker
        return side.client

    # -- scheduler side ------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int
                                   ) -> tuple[Optional[int], bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request,
                                                          num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks,
                                                 num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any
                             ) -> TierkvConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        assert self._scheduler is not None
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, Optional[dict[str, Any]]]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, block_ids)

    def take_events(self) -> Iterable[Any]:
        # tierkv publishes no KV cache events to vLLM's event stream.
        return ()

    def reset_cache(self) -> Optional[bool]:
        """See _SchedulerSide.reset_cache; None (nothing to reset) on a
        worker."""
        if self._scheduler is None:
            return None
        return self._scheduler.reset_cache()

    # -- worker side ---------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierkvConnectorMetadata)
        self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads go to requests outside the batch; none is waited for here.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any,
                      attn_metadata: Any, **kwargs: Any) -> None:
        # Stores copy whole blocks, every layer, in wait_for_save.
        return

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.wait_for_save()

    def wait_for_transfers(self, timeout: float) -> None:
        """See _WorkerSide.wait_for_transfers."""
        assert self._worker is not None
        self._worker.wait_for_transfers(timeout)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        assert self._worker is not None
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self._worker is not None
        return self._worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
