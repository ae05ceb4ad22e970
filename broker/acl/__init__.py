"""RocketMQ 4.x plain ACL (`aclEnable=true`, `plain_acl.yml`) on the broker.

- `addresses`: the white-list address patterns
- `permissions`: permission bits, and what each request code needs
- `plain`: the document, its accounts, the check of one request, and changes
- `service`: the file kept current, the guard on every request, requests 50-54
"""
