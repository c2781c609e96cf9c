"""What is deployed and what it costs: the resource spec (CDK and the local provisioner) and prices."""
