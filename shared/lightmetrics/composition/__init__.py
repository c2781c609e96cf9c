"""The composition root: the factories that wire boto3 clients, the settings
(:mod:`lightmetrics.deployment.settings`) and the host's hooks (:mod:`lightmetrics.protocol.hosting`)
into the services."""
