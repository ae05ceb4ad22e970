"""The broker's message store: the CommitLog record codec and message ids, with the
CommitLog kept in a DLedger log (one message per entry, physical offset = pos + 48)."""
