"""`./run.sh demo`: a name server and a 3-broker DLedger group survive a master kill.

RocketMQ's `fast-try`, plus the drill: produce and consume through a SIGKILL of the
master, then print the tally. Exit status 0 only if no acknowledged message is lost;
128 + the signal when stopped (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), after
the processes it started are stopped.
"""

from __future__ import annotations

import sys
import tempfile

from raftmq.process.signals import InterruptOnStopSignals
from raftmq.tools.broker_drill import run_drill, summary


def main() -> int:
    stop = InterruptOnStopSignals().install()
    with tempfile.TemporaryDirectory(prefix="raftmq-demo-") as tmp:
        tally = stop.run(run_drill, tmp, 2000, 16, 4, lambda text: print(f"  {text}", flush=True))
    if tally is None:
        print("\ndemo interrupted: its name server and brokers are stopped", file=sys.stderr)
        return stop.exit_status
    print()
    print(summary(tally))
    print(
        f"consumer offsets committed on the master: {tally.committed_offsets}; "
        f"queue ends: {tally.max_offsets}; out-of-order deliveries: {tally.order_violations}"
    )
    if tally.lost:
        print(f"FAILED: {len(tally.lost)} acknowledged messages never consumed")
        return 1
    print("OK: no acknowledged message lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
