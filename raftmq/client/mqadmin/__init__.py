"""`mqadmin`: RocketMQ's admin command line, for a raftmq cluster.

    mqadmin                                  the command list
    mqadmin help <command>                   one command's flags
    mqadmin clusterList -n 127.0.0.1:9876
    mqadmin updateTopic -n ... -c RaftCluster -t Orders -r 4 -w 4
    mqadmin dledgerStatus -n ...

Command names, flags and table layouts are RocketMQ 4.9's (`MQAdminStartup` and its
SubCommands), so an operator's scripts and habits carry over; `dledgerStatus` is
ours: one row per member of every DLedger group, unreachable members included.
`-n` falls back to the NAMESRV_ADDR environment variable, as RocketMQ's does.

Unlike RocketMQ's, which prints a stack trace and exits 0 whatever happened, the exit
status says what went wrong: 0 done, 1 a server answered with an error (printed with
its code and remark), 2 a usage error, 3 nothing that could answer was reached, 130
interrupted (Ctrl-C); each failure is one line on stderr.
"""

from raftmq.client.mqadmin.commands import COMMANDS
from raftmq.client.mqadmin.main import main

__all__ = ["COMMANDS", "main"]
