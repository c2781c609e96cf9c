"""What is deployed and how it is configured: the resource spec (CDK and the local provisioner), the
functions' timeouts the timing rules bound, the settings every function reads from ``LM_*``, and prices."""
