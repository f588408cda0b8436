"""Runs inside a fresh network namespace (``unshare -n``, loopback up): a real mooncake_master
on 127.0.0.1 and two engine processes (engine.py), then a conversation that moves between
them, a master killed mid-run and a new one started in its place. Prints one JSON object with
every engine reply.

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
    def __init__(self, python, name):
        self.name = name
        self.p = subprocess.Popen([python, os.path.join(HERE, "engine.py"), f"127.0.0.1:{RPC}",
                                   str(COOLDOWN_S)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline()
        if not ready:
            raise SystemExit(f"engine {name} did not start")

    def run(self, tokens):
        self.p.stdin.write(json.dumps({"op": "run", "tokens": tokens}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"engine {self.name} died")
        return dict(json.loads(line), engine=self.name)

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
         "--enable_http_metadata_server=false", "--enable_kv_events=false", "--enable_ha=false",
         "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1",
         "--http_metadata_server_host=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    binary, python = sys.argv[1], sys.argv[2]
    master = start_master(binary)
    engines = []
    out = {"steps": []}
    try:
        wait_port(RPC, master)
        a, b = Engine(python, "a"), Engine(python, "b")
        engines = [a, b]
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
