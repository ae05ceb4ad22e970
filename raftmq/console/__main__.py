"""`python -m raftmq.console`: the `mqconsole` command."""

import sys

from raftmq.console.cli import main

sys.exit(main())
