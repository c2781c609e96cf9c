"""The composition root: settings from the environment, the host's hooks, and the factories that wire
boto3 clients into the services."""
