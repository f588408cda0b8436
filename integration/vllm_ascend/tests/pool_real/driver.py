"""Runs inside a fresh network namespace (``unshare -n``, loopback up): a real mooncake_master
on 127.0.0.1 and engine processes (engine.py): a writer killed in the middle of its put and
the conversation continued without it; an entry truncated in the pool and replaced; a
conversation that moves between two engines, a master killed mid-run and a new one started in
its place; a hung master. Prints one JSON object with every engine reply.

    driver.py MOONCAKE_MASTER_BINARY PYTHON
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RPC, METRICS = 50951, 9903
COOLDOWN_S = 4.0  # the engines' circuit breaker
DISCARD_S = 5  # the master's put_start_discard_timeout_sec (default 30)
KILL_AFTER_S = 0.03  # into the writer's put of 24 MiB (about 150 ms on loopback)
WRITER_TRIES = 5


def wait_port(port, proc, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"mooncake_master exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"mooncake_master: port {port} not open")


class Engine:
    def __init__(self, python, name, segment=32 << 20):
        self.name = name
        self.p = subprocess.Popen([python, os.path.join(HERE, "engine.py"), f"127.0.0.1:{RPC}",
                                   str(COOLDOWN_S), str(segment)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline()
        if not ready:
            raise SystemExit(f"engine {name} did not start")

    def send(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"engine {self.name} died")
        return dict(json.loads(line), engine=self.name)

    def run(self, tokens):
        self.send(op="run", tokens=tokens)
        return self.read()

    def run_killed(self, tokens, ballast):
        """Runs ``tokens`` with its stores padded by ``ballast`` 4 MiB values and kills the
        process with SIGKILL once the put has begun. Returns the lines it printed after the
        announcement, and whether the put was still in flight when it died."""
        self.send(op="run", tokens=tokens, ballast=ballast)
        first = self.read()
        if first["op"] != "putting":
            raise SystemExit(f"writer: {first}")
        time.sleep(KILL_AFTER_S)
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        rest = [json.loads(x) for x in self.p.stdout.read().splitlines() if x.strip()]
        return {"announced": first, "after": rest,
                "in_flight": not any(x["op"] == "put" for x in rest)}

    def close(self):
        try:
            self.p.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.p.stdin.flush()
            self.p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def start_master(binary):
    return subprocess.Popen(
        [binary, f"--rpc_port={RPC}", f"--metrics_port={METRICS}",
         f"--put_start_discard_timeout_sec={DISCARD_S}",
         "--enable_http_metadata_server=false", "--enable_kv_events=false", "--enable_ha=false",
         "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1",
         "--http_metadata_server_host=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def killed_writer(out, a, b, c, python):
    """A writer computes a prompt and is killed while putting its pages (with 24 MiB of
    ballast in the same call, so that the kill lands inside it); b continues the conversation
    at once, while the keys are held by the dead put (so it computes the pages, and its stores
    of them fail); once the master's discard timeout has passed, a continues it and stores the
    pages, and c loads them. A kill that lands after the master completed the put (a loaded
    machine can delay it past the put's ~150 ms: c then finds the pages listed) is tried
    again with a new writer and a new prompt, at most WRITER_TRIES times."""
    out["writer_tries"] = []
    for attempt in range(WRITER_TRIES):
        kw = [(29 * i + 6 + attempt) % 251 for i in range(70)]  # 4 full pages + 6
        w = Engine(python, f"w{attempt}", segment=0)
        out["writer"] = w.run_killed(kw, 6)
        killed = time.monotonic()
        c.send(op="exists", tokens=kw)
        listed = c.read()["exist"]
        out["writer_tries"].append(listed)
        if out["writer"]["in_flight"] and not any(e == 1 for e in listed):
            break
    steps = out["killed_writer"] = []
    steps.append(b.run(kw + [(31 * i + 1) % 251 for i in range(20)]))
    out["blocked_for_s"] = round(time.monotonic() - killed, 2)
    time.sleep(max(0.0, killed + DISCARD_S + 1.0 - time.monotonic()))
    steps.append(a.run(kw + [(31 * i + 3) % 251 for i in range(20)]))
    steps.append(c.run(kw + [(31 * i + 4) % 251 for i in range(40)]))


def replaced_entry(out, a, b, c):
    """Twice, for a value one byte short, then one byte long: a stores a prompt's pages; c
    replaces page 1's entry in the pool by that value; b loads page 0, rejects page 1
    (removing it) and stores its own page 1; c loads every page."""
    steps = out["replaced"] = []
    out["poisoned"] = []
    for seed, delta in ((8, -1), (9, 1)):
        p = [(37 * i + seed) % 251 for i in range(70)]
        steps.append(a.run(p))
        c.send(op="poison", tokens=p, page=1, delta=delta)
        out["poisoned"].append(c.read())
        steps.append(b.run(p))
        steps.append(c.run(p + [1, 2, 3]))


def main():
    binary, python = sys.argv[1], sys.argv[2]
    master = start_master(binary)
    engines = []
    out = {"steps": []}
    try:
        wait_port(RPC, master)
        a, b = Engine(python, "a"), Engine(python, "b")
        c = Engine(python, "c")
        engines = [a, b, c]
        killed_writer(out, a, b, c, python)
        replaced_entry(out, a, b, c)
        turn1 = [(7 * i + 3) % 251 for i in range(70)]          # 4 full pages of 16 + 6
        turn2 = turn1 + [(5 * i + 1) % 251 for i in range(40)]  # 6 full pages + 14
        turn3 = turn2 + [(3 * i + 2) % 251 for i in range(30)]
        steps = out["steps"]
        steps.append(a.run(turn1))   # computed on a, stored
        steps.append(b.run(turn2))   # continued on b: a's pages from the pool
        steps.append(a.run(turn3))   # back on a: its own pages locally, b's from the pool
        master.send_signal(signal.SIGKILL)
        master.wait()
        out["master_killed"] = True
        other = [(11 * i + 4) % 251 for i in range(50)]
        steps.append(b.run(turn3))   # b: local hit, then the pool is unreachable
        steps.append(a.run(other))   # a: a fresh prompt, the breaker open: computed
        # A new master in the old one's place (empty: the entries died with the old one). The
        # clients reconnect on their own, but an engine's first calls after its cooldown may
        # still fail on the stale connection and open its breaker again: each engine runs a
        # short prompt of its own after each cooldown until one passes without a trip. Then a
        # fresh prompt computed on a is continued on b, which loads a's pages.
        master = start_master(binary)
        wait_port(RPC, master)
        out["master_restarted"] = True
        restart = out["after_restart"] = []
        for e, last in ((a, steps[-1]), (b, steps[-2])):
            trips = last["runtime"]["breaker_trips"]
            for attempt in range(5):
                time.sleep(COOLDOWN_S + 0.5)
                seed = 7 * attempt + (1 if e is a else 2)
                restart.append(e.run([(19 * i + seed) % 251 for i in range(20)]))
                if restart[-1]["runtime"]["breaker_trips"] == trips:
                    break
                trips = restart[-1]["runtime"]["breaker_trips"]
        fresh = [(13 * i + 5) % 251 for i in range(60)]  # 3 full pages + 12
        restart.append(a.run(fresh))
        restart.append(b.run(fresh + [(17 * i + 9) % 251 for i in range(20)]))
        # A hung master (stopped, its socket open): the request that meets it waits for one RPC
        # timeout (MC_RPC_TIMEOUT_MS), the breaker opens, the next request pays nothing.
        hung = out["hung"] = []
        hung.append(a.run([(23 * i + 1) % 251 for i in range(40)]))   # the master answers
        master.send_signal(signal.SIGSTOP)
        hung.append(a.run([(23 * i + 2) % 251 for i in range(40)]))   # one timeout
        hung.append(a.run([(23 * i + 3) % 251 for i in range(40)]))   # the breaker is open
        master.send_signal(signal.SIGCONT)
    finally:
        for e in engines:
            e.close()
        if master.poll() is None:
            master.kill()
            master.wait()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
