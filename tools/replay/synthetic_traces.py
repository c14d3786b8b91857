#!/usr/bin/env python3
"""Writes request traces in the Mooncake JSON-lines format for tierkv-replay.

Four shapes, deterministic (seed 17), to check an eviction policy against LRU
on workloads other than the shared trace (BENCHMARKS.md, "Eviction"):

  loop.jsonl   400 documents of 4 blocks, one after another, 10 times (a scan)
  zipf.jsonl   8,000 requests: one of 4 tenants' 8-block system prompts, a
               document drawn by Zipf (s = 0.9) among 5,000, a unique tail
  chat.jsonl   12,000 turns of conversations: each turn sends the previous
               prompt again plus an answer and a question (a growing prefix),
               after one of 8 system prompts; about 60 live at once
  mixed.jsonl  chat traffic with one-off documents of 10 to 60 blocks
               interleaved (30 % of turns)

Usage: tools/replay/synthetic_traces.py OUT_DIR
then:  build/tools/tierkv-replay OUT_DIR/chat.jsonl --policy all
"""
import json
import random
import sys


def write(path, requests):
    with open(path, "w") as f:
        for t, ids in enumerate(requests):
            f.write(json.dumps({"timestamp": t, "input_length": 512 * len(ids),
                                "output_length": 1, "hash_ids": ids}) + "\n")


def loop(n_docs=400, doc_len=4, rounds=10):
    return [list(range(d * doc_len, (d + 1) * doc_len))
            for _ in range(rounds) for d in range(n_docs)]


def zipf(rng, n_docs=5000, n_requests=8000, s=0.9, shared=8):
    weights = [1 / (i + 1) ** s for i in range(n_docs)]
    next_id = 10_000_000
    requests = []
    for _ in range(n_requests):
        d = rng.choices(range(n_docs), weights)[0]
        ids = [1_000_000 + (d % 4) * 100 + i for i in range(shared)]
        ids += [2_000_000 + d * 16 + i for i in range(1 + d % 12)]
        tail = rng.randint(0, 6)
        ids += list(range(next_id, next_id + tail))
        next_id += tail
        requests.append(ids)
    return requests


def chat(rng, n_conversations=3000, n_requests=12000, live_at_once=60):
    next_id = [0]

    def fresh(k):
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    systems = [fresh(rng.randint(2, 10)) for _ in range(8)]
    live = []
    requests = []
    started = 0
    while len(requests) < n_requests:
        if len(live) < live_at_once and started < n_conversations:
            live.append(list(rng.choice(systems)) + fresh(rng.randint(1, 6)))
            started += 1
        i = rng.randrange(len(live))
        requests.append(list(live[i]))
        live[i] += fresh(rng.randint(1, 4))
        if len(live[i]) > 200 or rng.random() < 0.12:
            live.pop(i)
        if not live and started >= n_conversations:
            break
    return requests


def mixed(rng):
    requests = []
    next_id = 50_000_000
    for r in chat(rng, n_requests=8000):
        requests.append(r)
        if rng.random() < 0.3:
            k = rng.randint(10, 60)
            requests.append(list(range(next_id, next_id + k)))
            next_id += k
    return requests


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rng = random.Random(17)
    write(f"{out}/loop.jsonl", loop())
    write(f"{out}/zipf.jsonl", zipf(rng))
    write(f"{out}/chat.jsonl", chat(rng))
    write(f"{out}/mixed.jsonl", mixed(rng))


if __name__ == "__main__":
    main()
