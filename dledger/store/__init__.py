"""DLedger's storage: the entry codec, the segment layout, a file store and a memory store."""
