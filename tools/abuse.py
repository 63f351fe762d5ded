#!/usr/bin/env python3
"""Abuse run against a running `deepinfer serve` (docs/RELIABILITY.md): load, fuzz and slow
sockets at once, while /health is probed and the server's memory sampled.

    python3 tools/abuse.py --base http://127.0.0.1:8000 --pid PID [--duration 150]

Standard library only. Runs, all at the same time, for --duration seconds:
  * health: a fresh connection and GET /health every 50 ms, timed to the last byte;
  * memory: the server's VmRSS every 100 ms (and VmHWM at the end);
  * load: waves of 500 concurrent streamed completions, half dropped after three chunks;
  * fuzz: mutated request bodies on every route, 32 at a time;
  * slow sockets: 1200 connections kept open (idle, headers or a body a byte at a time,
    streams that are never read), reopened when the server closes them;
  * big bodies: the requests of issue 18 (100 000 stop strings with n=128 twice at once,
    30 MiB /tokenize, 30 MiB of token ids, a 7 MiB prompt just under the bound, 1.16 M
    logit_bias keys with n=128, a declared 1 GiB body).
Prints a JSON report; exits 1 if any answer was a 5xx other than 503.
"""

import argparse
import asyncio
import json
import multiprocessing
import random
import socket
import sys
import threading
import time
from urllib.parse import urlparse

STATUS = {}
LOCK = threading.Lock()


def count(kind, status):
    with LOCK:
        STATUS.setdefault(kind, {}).setdefault(str(status), 0)
        STATUS[kind][str(status)] += 1


def request_bytes(method, path, body=b"", extra=""):
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n")
    return head.encode() + body


async def exchange(host, port, data, read_limit=None, timeout=600):
    """Sends `data` on a new connection; returns (status, seconds, bytes read)."""
    t = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
    except Exception:
        return None, time.monotonic() - t, 0
    try:
        w.write(data)
        await w.drain()
        got = b""
        while True:
            chunk = await asyncio.wait_for(r.read(65536), timeout)
            if not chunk:
                break
            got += chunk
            if read_limit and len(got) >= read_limit:
                break
        status = int(got[9:12]) if got.startswith(b"HTTP/1.1 ") else None
        return status, time.monotonic() - t, len(got)
    except Exception:
        return None, time.monotonic() - t, 0
    finally:
        w.close()


def health_prober(host, port, stop, conn):
    """Runs in its own process, so the load generator's work never delays a probe."""
    out = []
    while not stop.is_set():
        t = time.monotonic()
        try:
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got = b""
            while True:
                c = s.recv(4096)
                if not c:
                    break
                got += c
            s.close()
            ok = got.startswith(b"HTTP/1.1 200")
        except Exception:
            ok = False
        out.append((time.time(), time.monotonic() - t, ok))
        time.sleep(0.05)
    conn.send(out)


def memory_sampler(pid, stop, out):
    while not stop.is_set():
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    out.append((time.time(), int(line.split()[1]) / 1024))
        except FileNotFoundError:
            return
        time.sleep(0.1)


async def load_waves(host, port, deadline, waves):
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 32, "ignore_eos": True,
                       "stream": True}).encode()
    while time.monotonic() < deadline - 30:
        t = time.monotonic()

        async def one(i):
            limit = 600 if i % 2 else None  # half hang up after about three chunks
            status, _, _ = await exchange(host, port, request_bytes("POST", "/v1/completions", body),
                                          read_limit=limit)
            count("load", status)
        await asyncio.gather(*(one(i) for i in range(500)))
        waves.append(time.monotonic() - t)


def mutate(rng, v, depth=0):
    pool = [None, True, 0, -1, 2**63, 1e308, "", "x" * rng.randrange(50000), [], {},
            list(range(rng.randrange(20000))), "<｜User｜>", [[1]] * 3,
            {str(i).zfill(rng.randrange(8)): 1 for i in range(rng.randrange(3000))}]
    fields = ["prompt", "messages", "max_tokens", "n", "stop", "logit_bias", "stream",
              "logprobs", "top_logprobs", "temperature", "tokens", "tools", "seed",
              "stop_token_ids", "echo", "stream_options", "min_tokens"]
    if isinstance(v, dict) and v and depth < 3 and rng.random() < 0.3:
        k = rng.choice(list(v))
        v[k] = mutate(rng, v[k], depth + 1)
        return v
    if isinstance(v, dict):
        if v and rng.random() < 0.3:
            del v[rng.choice(list(v))]
        else:
            v[rng.choice(fields)] = rng.choice(pool)
        return v
    return rng.choice(pool)


async def fuzz(host, port, deadline, seed):
    rng = random.Random(seed)
    seeds = [
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 4}),
        ("/v1/completions", {"prompt": [[5, 6], [7]], "n": 2, "stream": True, "max_tokens": 3,
                             "stop": ["\n"], "logprobs": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                  "max_tokens": 4, "stream": True}),
        ("/tokenize", {"prompt": "Hello world"}),
        ("/detokenize", {"tokens": [100, 200]}),
    ]

    async def worker():
        while time.monotonic() < deadline:
            path, base = rng.choice(seeds)
            v = json.loads(json.dumps(base))
            for _ in range(rng.randrange(1, 4)):
                v = mutate(rng, v)
            if isinstance(v, dict) and rng.random() < 0.75:
                v["max_tokens"] = 4
            body = json.dumps(v).encode()
            if rng.random() < 0.2:
                b = bytearray(body)
                for _ in range(rng.randrange(1, 6)):
                    if b:
                        b[rng.randrange(len(b))] = rng.randrange(256)
                body = bytes(b)
            status, _, _ = await exchange(host, port, request_bytes("POST", path, body), timeout=120)
            count("fuzz", status)
    await asyncio.gather(*(worker() for _ in range(32)))


async def slow_sockets(host, port, deadline, n, opened):
    stream = json.dumps({"prompt": [5, 6, 7], "n": 4, "max_tokens": 20000, "ignore_eos": True,
                         "stream": True, "logprobs": 5}).encode()

    async def keep(kind):
        while time.monotonic() < deadline:
            try:
                if kind == "reader":
                    s = socket.socket()
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    s.setblocking(False)
                    await asyncio.get_running_loop().sock_connect(s, (host, port))
                    r, w = await asyncio.open_connection(sock=s)
                else:
                    r, w = await asyncio.open_connection(host, port)
            except Exception:
                await asyncio.sleep(1)
                continue
            opened[0] += 1
            try:
                if kind == "idle":
                    await asyncio.wait_for(r.read(1), deadline - time.monotonic())
                elif kind == "headers":
                    for ch in b"GET /health HTTP/1.1\r\nHost: x\r\n":
                        w.write(bytes([ch]))
                        await w.drain()
                        await asyncio.sleep(1)
                elif kind == "body":
                    w.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
                    for _ in range(1000):
                        w.write(b" ")
                        await w.drain()
                        await asyncio.sleep(1)
                else:
                    w.write(request_bytes("POST", "/v1/completions", stream))
                    await w.drain()
                    await asyncio.sleep(max(0, deadline - time.monotonic()))
            except Exception:
                pass
            finally:
                w.close()
    kinds = ["idle"] * (n // 3) + ["headers"] * (n // 3) + ["body"] * (n // 4)
    kinds += ["reader"] * (n - len(kinds))
    tasks = []
    for k in kinds:
        tasks.append(asyncio.create_task(keep(k)))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)


async def big_bodies(host, port, results, start):
    async def send(name, path, body, extra=""):
        at = time.time() - start
        status, secs, _ = await exchange(host, port, request_bytes("POST", path, body, extra))
        print(f"{name}: {status} in {secs:.2f} s", file=sys.stderr, flush=True)
        results.append({"request": name, "status": status, "seconds": round(secs, 3),
                        "sent_at_s": round(at, 1)})
        count("big", status)
    stops = json.dumps({"prompt": "Hi", "n": 128, "max_tokens": 64,
                        "stop": [f"stop-{i:06}" for i in range(100000)]}).encode()
    await asyncio.gather(send("100k stops, n=128 (a)", "/v1/completions", stops),
                         send("100k stops, n=128 (b)", "/v1/completions", stops))
    await send("30 MiB /tokenize", "/tokenize",
               json.dumps({"prompt": "hello world " * ((30 << 20) // 12)}).encode())
    ids = b'{"max_tokens": 1, "prompt": [1' + b",1" * (15 << 20) + b"]}"
    await send("30 MiB of token ids", "/v1/completions", ids)
    await send("7 MiB prompt (under the bound: tokenized)", "/tokenize",
               json.dumps({"prompt": "hello world " * ((7 << 20) // 12)}).encode())
    bias = b'{"prompt": [1, 2], "n": 128, "max_tokens": 2, "logit_bias": {' + b",".join(
        f'"{str(i % 1000).zfill(1 + i // 1000 % 9)}": 1'.encode() for i in range(1_160_000)) + b"}}"
    await send("1.16 M logit_bias keys, n=128", "/v1/completions", bias)
    t = time.monotonic()
    status, secs, _ = await exchange(host, port, (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n").encode(),
        read_limit=12)
    results.append({"request": "declared 1 GiB body", "status": status,
                    "seconds": round(secs, 3)})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else None


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--duration", type=float, default=150)
    ap.add_argument("--slow", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=18)
    a = ap.parse_args()
    u = urlparse(a.base)
    host, port = u.hostname, u.port
    stop = threading.Event()
    memory = []
    probe_stop = multiprocessing.Event()
    receiver, sender = multiprocessing.Pipe(duplex=False)
    prober = multiprocessing.Process(target=health_prober,
                                     args=(host, port, probe_stop, sender), daemon=True)
    prober.start()
    threading.Thread(target=memory_sampler, args=(a.pid, stop, memory), daemon=True).start()
    await asyncio.sleep(3)
    start = time.time()
    deadline = time.monotonic() + a.duration
    waves, big, opened = [], [], [0]
    tasks = [asyncio.create_task(c, name=n) for n, c in (
        ("load", load_waves(host, port, deadline, waves)),
        ("fuzz", fuzz(host, port, deadline, a.seed)),
        ("slow sockets", slow_sockets(host, port, deadline, a.slow, opened)),
        ("big bodies", big_bodies(host, port, big, start)),
    )]
    # Whatever is still going a minute past the deadline is cut off (and reported).
    _, pending = await asyncio.wait(tasks, timeout=a.duration + 60)
    for t in pending:
        t.cancel()
    cut_off = [t.get_name() for t in pending]
    end = time.time()
    await asyncio.sleep(5)
    stop.set()
    probe_stop.set()
    health = receiver.recv()
    prober.join()
    hwm = None
    for line in open(f"/proc/{a.pid}/status"):
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    during = [d * 1000 for (t, d, ok) in health if start <= t <= end]
    failed = [1 for (t, d, ok) in health if start <= t <= end and not ok]
    base_ms = [d * 1000 for (t, d, _) in health if t < start]
    rss = [m for (t, m) in memory]
    slowest = sorted(((d * 1000, t - start) for (t, d, _) in health if start <= t <= end),
                     reverse=True)[:5]
    report = {
        "duration_s": round(end - start, 1),
        "health_ms_quiet": {"n": len(base_ms), "p50": pct(base_ms, 50), "max": max(base_ms or [0])},
        "health_ms_under_abuse": {"n": len(during), "p50": pct(during, 50), "p99": pct(during, 99),
                                  "max": max(during or [0]), "failed": len(failed),
                                  "over_50ms": sum(1 for d in during if d > 50)},
        "slowest_health_probes_ms_at_s": [[round(d, 1), round(t, 1)] for d, t in slowest],
        "rss_mib": {"before": rss[0] if rss else None, "max_sampled": max(rss or [0]),
                    "after": rss[-1] if rss else None, "VmHWM": hwm},
        "load_waves_s": [round(w, 1) for w in waves],
        "slow_sockets_opened": opened[0],
        "tasks_cut_off_at_deadline": cut_off,
        "big_bodies": big,
        "statuses": STATUS,
    }
    for k in ("health_ms_quiet", "health_ms_under_abuse"):
        for f in ("p50", "p99", "max"):
            if report[k].get(f) is not None:
                report[k][f] = round(report[k][f], 1)
    print(json.dumps(report, indent=1))
    bad = [s for kind in STATUS.values() for s in kind if s not in ("None",) and int(s) >= 500
           and int(s) != 503]
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    asyncio.run(main())
