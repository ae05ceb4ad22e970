"""The main job: a local 3-replica DLedger group survives a leader kill with nothing lost.

`./run.sh demo` runs it: three `dledger server` processes on 127.0.0.1, appends
from many concurrent clients, kill -9 of the leader, a new leader, every
acknowledged entry read back, the killed replica restarted and caught up, and the
replicas' data files compared byte for byte up to the committed position.
Ctrl-C, SIGTERM or SIGHUP stops the three servers and exits with 128 + the signal.
"""

from __future__ import annotations

import sys
import tempfile

from raftmq.process.signals import InterruptOnStopSignals
from raftmq.tools.dledger_drill import run_drill
from raftmq.tools.dledger_local import LocalGroup


async def drill() -> int:
    with tempfile.TemporaryDirectory(prefix="dledger-demo-") as tmp:
        print(f"starting 3 dledger servers under {tmp}")
        async with LocalGroup(tmp, 3, group="demo") as group:
            print(f"peers: {group.peers_arg}")
            report = await run_drill(group, log=lambda text: print(f"  {text}", flush=True))
    print()
    print(f"{'sent':>10} {'acked':>10} {'unknown':>10} {'lost':>6} {'failover':>10}")
    print(
        f"{report.sent:>10} {report.acknowledged:>10} {report.unknown:>10} "
        f"{len(report.lost):>6} {report.failover_ms:>8.0f}ms"
    )
    ok = not report.lost and report.restarted_caught_up and not report.mismatched_replicas
    print("OK: no acknowledged entry lost" if ok else "FAILED")
    return 0 if ok else 1


def main() -> int:
    stop = InterruptOnStopSignals().install()
    status = stop.run(drill)
    if status is None:
        print("\ndemo interrupted: its dledger servers are stopped", file=sys.stderr)
        return stop.exit_status
    return status


if __name__ == "__main__":
    sys.exit(main())
