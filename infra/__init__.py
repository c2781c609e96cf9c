"""The lightmetrics CDK app (``cdk.json`` runs ``python -m infra.app``)."""
