"""The protocol core: identities, keys, frame v1, the S3 objects' schemas, conditional-create outcomes,
errors, the clock, retry timing and the object-store port. Pure: no I/O, no boto3, no service
(docs/protocol.md)."""
