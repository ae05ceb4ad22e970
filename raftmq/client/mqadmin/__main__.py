"""`python -m raftmq.client.mqadmin`: the `mqadmin` command."""

import sys

from raftmq.client.mqadmin.main import main

sys.exit(main())
