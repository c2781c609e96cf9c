"""The adapters: S3 (the object-store port's implementation), DynamoDB (the control table), SQS, Step
Functions, the request counter and metrics. The only modules that import boto3."""
