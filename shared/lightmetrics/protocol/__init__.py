"""The protocol core: identities, keys, frame v1, the S3 objects' schemas, conditional-create outcomes,
errors, the clock and the host that supplies it, retry timing, the timing rules, retention tombstones
as readers see them, and the ports (object store, control table, metrics). Pure: no I/O, no boto3,
no service (docs/protocol.md)."""
