"""The text of configuration, read in one place for the name server, the broker, DLedger and
the clients: Java properties, host:port addresses and DLedger's peers string, and the
table-driven loader of config keys."""
