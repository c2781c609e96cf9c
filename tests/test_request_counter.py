"""The request counter: every attempt counts, and an attempt that got no answer is told apart, so a
cost assertion can follow what the logic sent while a busy machine's timeouts are retried."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError

from lightmetrics.aws.request_counter import RequestCounter
from lightmetrics.aws.s3_store import s3_client_config


def test_an_attempt_without_an_answer_counts_as_sent_and_as_unanswered() -> None:
    counter = RequestCounter()
    client = counter.attach(
        boto3.client(
            "s3",
            endpoint_url="http://127.0.0.1:9",  # the discard port: nothing listens, the connect is refused
            region_name="us-east-1",
            aws_access_key_id="k",
            aws_secret_access_key="s",
            config=s3_client_config(timeout_s=1),
        )
    )
    with counter.operation("list") as op:
        for _ in range(2):
            with pytest.raises(EndpointConnectionError):
                client.list_objects_v2(Bucket="b")
    assert op.by_api == {"s3.ListObjectsV2": 2}
    assert op.unanswered_by_api == {"s3.ListObjectsV2": 2}
    assert op.answered() == {}
