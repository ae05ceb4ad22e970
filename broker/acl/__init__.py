"""RocketMQ 4.x plain ACL (`aclEnable=true`, `plain_acl.yml`) on the broker.

- `addresses`: the white-list address patterns
- `permissions`: permission bits, and what each request code needs
- `plain`: the document, its accounts, the check of one request, and changes

The broker's side of it (the file kept current, the guard on every request, requests
50-54) is `raftmq.broker.access_control`: it needs the broker's config, role and
metadata writer, which this package, below the broker, does not import.
"""
