#!/usr/bin/python3
"""tierkvd's KV cache events as a cache-aware router follows them.

A real tierkvd (host tier over a disk tier) publishes vLLM-format events on
ZeroMQ while real worker processes store, load (promoting from disk), spill
and an operator evicts and clears. A subscriber decodes every batch the way
vLLM's msgspec types read it (array-like, tag first), rebuilds the set of
block hashes per medium (CPU, DISK), and must end with exactly the keys
`tierkv-admin held` lists. A late subscriber catches up through the replay
socket and must end with the same index. Sequence numbers must have no gap
that replay cannot fill; they start where tierkvd's clock says, so a router
learns the first one from what it receives. Both hash forms run: integers (a key's low 64 bits,
vLLM's default form) and the whole 16-byte keys.

Run by ctest (KvEventsSubscriber) with the paths of tierkvd, tierkv-admin
and tierkv_test_worker; needs Debian's python3-zmq and python3-msgpack.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

BLOCK_BYTES = 2 * 2 * 2 * 64 * 16 * 2  # 2 layers, K and V, 2 heads, 64, bf16.
DEADLINE_S = 20.0
END_SEQ = -1


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def hash_name(h, hash_format):
    """A block hash as text: the key's hex digits, or the low word's."""
    if hash_format == "int":
        check(isinstance(h, int) and 0 <= h < 2**64, f"int hash {h!r}")
        return f"{h:016x}"
    check(isinstance(h, bytes) and len(h) == 16, f"bytes hash {h!r}")
    return h.hex()


def decode_batch(payload, hash_format):
    """A KVEventBatch as vLLM's msgspec decoder reads it:
    [ts, events, data_parallel_rank]."""
    batch = msgpack.unpackb(payload, raw=False)
    check(isinstance(batch, list) and len(batch) == 3 and batch[2] == 0,
          f"a batch is [ts, events, 0], got {batch!r}")
    ts, events = batch[0], batch[1]
    check(isinstance(ts, float), f"ts {ts!r} is not a float")
    decoded = []
    for event in events:
        check(isinstance(event, list) and event, f"event {event!r}")
        tag = event[0]
        if tag == "BlockStored":
            # block_hashes, parent_block_hash, token_ids, block_size,
            # lora_id, medium, lora_name
            check(len(event) >= 7, f"BlockStored {event!r}")
            hashes, parent, tokens, block_size, lora, medium = event[1:7]
            if parent is not None:
                hash_name(parent, hash_format)
            # Full blocks, or one partial block (a chunk's last) alone.
            check(len(tokens) == len(hashes) * block_size or
                  (len(hashes) == 1 and 0 < len(tokens) < block_size),
                  f"{len(tokens)} tokens for {len(hashes)} blocks of "
                  f"{block_size}")
            check(lora is None or isinstance(lora, int), f"lora {lora!r}")
            decoded.append(("stored", medium,
                            [hash_name(h, hash_format) for h in hashes]))
        elif tag == "BlockRemoved":
            check(len(event) >= 3, f"BlockRemoved {event!r}")
            decoded.append(("removed", event[2],
                            [hash_name(h, hash_format) for h in event[1]]))
        elif tag == "AllBlocksCleared":
            decoded.append(("cleared", None, []))
        else:
            raise Failure(f"unknown event tag {tag!r}")
    return decoded


class Router:
    """One subscriber: live stream plus replay for what it missed."""

    def __init__(self, context, endpoint, replay_endpoint, hash_format,
                 topic=b""):
        self.hash_format = hash_format
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay = context.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.next_seq = None  # Learnt from the first batch.
        self.index = {"CPU": set(), "DISK": set(), "REMOTE": set()}
        self.replayed = 0
        self.applied = 0

    def apply(self, seq, payload):
        check(self.next_seq is None or seq == self.next_seq,
              f"batch {seq} where {self.next_seq} was due")
        for kind, medium, hashes in decode_batch(payload, self.hash_format):
            if kind == "cleared":
                for held in self.index.values():
                    held.clear()
                continue
            check(medium in self.index, f"medium {medium!r}")
            if kind == "stored":
                self.index[medium].update(hashes)
            else:
                self.index[medium].difference_update(hashes)
        self.next_seq = seq + 1
        self.applied += 1

    def catch_up(self):
        """Asks the replay socket for everything from next_seq on (from the
        start of the ring when it has seen nothing)."""
        start = self.next_seq or 0
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        end = time.monotonic() + DEADLINE_S
        while True:
            check(self.replay.poll(int((end - time.monotonic()) * 1000)),
                  "replay sent no end marker")
            empty, seq_bytes, payload = self.replay.recv_multipart()
            check(empty == b"", "replay frames start with an empty frame")
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                return
            if self.next_seq is None or seq >= self.next_seq:
                self.apply(seq, payload)
                self.replayed += 1

    def drain(self):
        """Applies every live batch waiting; a gap is filled by replay."""
        while self.sub.poll(0):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if self.next_seq is None:
                self.catch_up()  # Joined live: the history first.
                if self.next_seq is None:
                    self.apply(seq, payload)
                    continue
            if seq < self.next_seq:
                continue  # Replay brought it already.
            if seq > self.next_seq:
                self.catch_up()
                if seq < self.next_seq:
                    continue
            self.apply(seq, payload)


def held_keys(admin, socket_path, hash_format=None):
    """tierkvd's index: the keys per medium, as the events name them (the
    int form is a key's low word, its last 16 hex digits), or whole."""
    out = subprocess.run([admin, "--socket", socket_path, "held"],
                         check=True, capture_output=True, text=True).stdout
    index = {"CPU": set(), "DISK": set(), "REMOTE": set()}
    for line in out.splitlines():
        check(not line.startswith("#"), f"held list cut: {line}")
        medium, key = line.split()
        index[medium].add(key[16:] if hash_format == "int" else key)
    return index


def wait_for_match(routers, admin, socket_path, what):
    """Drains the routers until each index equals tierkvd's, or fails."""
    end = time.monotonic() + DEADLINE_S
    while True:
        held = held_keys(admin, socket_path, routers[0].hash_format)
        for router in routers:
            router.drain()
        if all(router.index == held for router in routers):
            return held
        # A router that joined late misses the batches published between
        # its replay and its subscription taking effect (ZeroMQ subscribes
        # asynchronously), and sees no gap while no later batch comes: it
        # asks the replay socket again from the next number it needs.
        for router in routers:
            router.catch_up()
        if time.monotonic() > end:
            for router in routers:
                for medium in held:
                    extra = router.index[medium] - held[medium]
                    missing = held[medium] - router.index[medium]
                    print(f"{what}: {medium}: {len(extra)} extra, "
                          f"{len(missing)} missing", file=sys.stderr)
            raise Failure(f"{what}: the events never matched tierkvd's index")
        time.sleep(0.02)  # Polling a condition, with a deadline above.


def run_worker(worker, mode, socket_path, seed, requests, blocks):
    result = subprocess.run(
        [worker, mode, socket_path, str(seed), str(requests), str(blocks)],
        capture_output=True, text=True, timeout=DEADLINE_S)
    check(result.returncode == 0,
          f"worker {mode} failed: {result.stdout}{result.stderr}")
    return result.stdout


def admin_call(admin, socket_path, *args):
    subprocess.run([admin, "--socket", socket_path, *args], check=True,
                   capture_output=True, timeout=DEADLINE_S)


def start_tierkvd(args, tmp, store, hash_format):
    socket_path = os.path.join(tmp, "tierkvd.sock")
    events = f"ipc://{tmp}/events"
    replay = f"ipc://{tmp}/replay"
    log = open(os.path.join(tmp, "tierkvd.log"), "w+")
    slots = 8
    daemon = subprocess.Popen(
        [args.tierkvd, "--store", store, "--socket", socket_path,
         "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
         "--dtype", "bf16", "--host-capacity", str((slots + 1) * BLOCK_BYTES),
         "--disk-dir", os.path.join(tmp, "disk"), "--disk-capacity", "64M",
         "--spill-high", "0.5", "--spill-low", "0.25",
         "--kv-events-endpoint", events,
         "--kv-events-replay-endpoint", replay,
         "--kv-events-hash-format", hash_format],
        stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + DEADLINE_S
    while True:
        log.seek(0)
        text = log.read()
        if "serving store" in text:
            return daemon, socket_path, events, replay, log
        if daemon.poll() is not None or time.monotonic() > end:
            daemon.kill()
            raise Failure(f"tierkvd did not start:\n{text}")
        time.sleep(0.02)  # Waiting for its log line, with a deadline.


def scenario(args, hash_format):
    """One tierkvd, its workload and two routers; 0 when they agree."""
    tmp = tempfile.mkdtemp(prefix="kv_events_subscriber.")
    store = f"kvev{os.getpid()}"
    daemon = None
    log = None
    context = zmq.Context()
    try:
        daemon, socket_path, events, replay, log = start_tierkvd(
            args, tmp, store, hash_format)
        # Connected before any worker: it still missed the first batch
        # (AllBlocksCleared, published at start), which replay fills in.
        router = Router(context, events, replay, hash_format)
        router.catch_up()
        check(router.replayed >= 1, "the first batch was not replayed")

        # Eight host slots over the disk tier: 6 requests x 2 blocks spill
        # and evict; verify promotes from disk.
        run_worker(args.worker, "fill", socket_path, 1, 6, 2)
        wait_for_match([router], args.admin, socket_path, "after fill")
        out = run_worker(args.worker, "verify", socket_path, 1, 6, 2)
        check(" wrong 0" in out, f"verify: {out}")
        held = wait_for_match([router], args.admin, socket_path,
                              "after verify")
        check(held["CPU"] and held["DISK"],
              f"both tiers hold blocks: {held}")

        # An operator evicts one block, then clears the host tier.
        key = sorted(held_keys(args.admin, socket_path)["DISK"])[0]
        admin_call(args.admin, socket_path, "evict", key)
        held = wait_for_match([router], args.admin, socket_path, "after evict")
        name = key[16:] if hash_format == "int" else key
        check(name not in held["DISK"] and name not in held["CPU"],
              f"{key} evicted")
        admin_call(args.admin, socket_path, "clear", "--tier", "host")
        held = wait_for_match([router], args.admin, socket_path,
                              "after clear host")
        check(not held["CPU"], f"host cleared: {held['CPU']}")

        # More traffic, then a late router: replay from the start, then
        # the live stream; both end with tierkvd's index.
        run_worker(args.worker, "churn", socket_path, 2, 5, 2)
        late = Router(context, events, replay, hash_format)
        late.catch_up()
        check(late.replayed > 1, "the late router replayed the history")
        wait_for_match([router, late], args.admin, socket_path, "after churn")
        admin_call(args.admin, socket_path, "clear", "--tier", "all")
        held = wait_for_match([router, late], args.admin, socket_path,
                              "after clear all")
        check(not held["CPU"] and not held["DISK"], f"all cleared: {held}")
        run_worker(args.worker, "fill", socket_path, 3, 3, 2)
        wait_for_match([router, late], args.admin, socket_path,
                       "after refill")
        print(f"OK ({hash_format} hashes): {router.applied} batches "
              f"followed, the late router replayed {late.replayed}")
        return 0
    except Failure as e:
        print(f"FAIL ({hash_format} hashes): {e}", file=sys.stderr)
        if log is not None:
            log.seek(0)
            print(log.read()[-4000:], file=sys.stderr)
        return 1
    finally:
        context.destroy(linger=0)
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tierkvd", required=True)
    parser.add_argument("--admin", required=True)
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    return max(scenario(args, "int"), scenario(args, "bytes"))


if __name__ == "__main__":
    sys.exit(main())
