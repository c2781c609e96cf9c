"""What is deployed and what it costs: the resource spec (CDK and the local provisioner), state machine
definitions, stack outputs, prices and the cost model."""
