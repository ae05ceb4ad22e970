"""Where DLedger groups should lead: the plan that `mqadmin balanceDLedgerLeaders` and a
broker's automatic leader balancing (`enableAutoLeaderBalance`) both carry out."""
