"""ClientError classification (lightmetrics.aws.errors): each AWS error code, injected at a real
botocore client (``botocore.stub.Stubber``: the response is parsed as the service's), ends as it
should — a transient one is retried later under the retry budget, a refusal blocks its unit at once
with a message naming the operation and the code, and a missing bucket or table names its setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from lightmetrics.aws.control_table import ControlTable
from lightmetrics.aws.errors import is_transient
from lightmetrics.aws.s3_store import S3ObjectStore
from lightmetrics.harness.testing.memory import NO_WAIT, memory_system
from lightmetrics.protocol.errors import ResourceAccessError
from lightmetrics.work.outcome import Outcome
from lightmetrics.work.units import run_unit

TRANSIENT = "RETRY_LATER"
PERMANENT = "BLOCKED"


_SESSION = boto3.session.Session()


def _client(service: str, operation: str, code: str, status: int, times: int) -> Any:
    client = _SESSION.client(service, region_name="eu-west-1", aws_access_key_id="k",
                                            aws_secret_access_key="s")
    stubber = Stubber(client)
    for _ in range(times):
        stubber.add_client_error(operation, service_error_code=code, service_message=f"{code} from the stub",
                                 http_status_code=status)
    stubber.activate()
    return client


def _run(fn: Callable[[], Any]) -> Any:
    system = memory_system()

    def unit() -> Outcome:
        fn()
        return Outcome.DONE

    return run_unit(system.ctx, kind="test", object_key="k", source="test", fn=unit), system


S3_CASES = [("SlowDown", 503, TRANSIENT), ("InternalError", 500, TRANSIENT), ("ServiceUnavailable", 503, TRANSIENT),
            ("RequestTimeout", 400, TRANSIENT), ("OperationAborted", 409, TRANSIENT), ("RequestTimeTooSkewed", 403, TRANSIENT),
            ("AccessDenied", 403, PERMANENT), ("NoSuchBucket", 404, PERMANENT), ("InvalidArgument", 400, PERMANENT),
            ("MalformedXML", 400, PERMANENT)]


@pytest.mark.parametrize("code, status, outcome", S3_CASES)
def test_an_s3_delete_refused_blocks_its_unit_and_a_transient_one_is_retried(code: str, status: int, outcome: str) -> None:
    store = S3ObjectStore(_client("s3", "delete_object", code, status, 1), "lm-bucket", read_policy=NO_WAIT)
    result, system = _run(lambda: store.delete("raw-blobs/v1/x"))
    assert result.outcome.value == outcome
    if outcome == PERMANENT:
        assert f"DeleteObject answered {code} ({status})" in result.detail
        [blocker] = system.ctx.blockers.list(status="open")
        assert code in blocker.reason
        assert system.ctx.budget.get("test:k") is None  # no retry budget spent on a refusal
    else:
        assert system.ctx.budget.get("test:k").count == 1 and system.ctx.blockers.list(status="open") == []


@pytest.mark.parametrize("code, status, outcome", S3_CASES)
def test_an_s3_read_is_classified_by_the_adapter_the_same_way(code: str, status: int, outcome: str) -> None:
    attempts = NO_WAIT.max_attempts if outcome == TRANSIENT else 1
    store = S3ObjectStore(_client("s3", "get_object", code, status, attempts), "lm-bucket", read_policy=NO_WAIT)
    result, _ = _run(lambda: store.get("accepted/v1/x.json"))
    assert result.outcome.value == outcome
    if outcome == PERMANENT:
        assert code in result.detail or ("does not exist" in result.detail and code == "NoSuchBucket")


@pytest.mark.parametrize("code, status, outcome", [
    ("ProvisionedThroughputExceededException", 400, TRANSIENT), ("ThrottlingException", 400, TRANSIENT),
    ("RequestLimitExceeded", 400, TRANSIENT), ("InternalServerError", 500, TRANSIENT),
    ("TransactionConflictException", 400, TRANSIENT),
    ("ValidationException", 400, PERMANENT), ("SerializationException", 400, PERMANENT),
])
def test_a_control_table_error_is_retried_or_blocks(code: str, status: int, outcome: str) -> None:
    table = ControlTable(_client("dynamodb", "update_item", code, status, 1), "lm-table")
    result, _ = _run(lambda: table.update("p", "s", "SET #x = :x", names={"#x": "x"}, values={":x": 1}))
    assert result.outcome.value == outcome
    if outcome == PERMANENT:
        assert f"UpdateItem answered {code} ({status})" in result.detail


def test_sqs_throttling_is_transient_though_it_answers_403() -> None:
    throttled = ClientError({"Error": {"Code": "RequestThrottled"}, "ResponseMetadata": {"HTTPStatusCode": 403}},
                            "SendMessage")
    assert is_transient(throttled)


@pytest.mark.parametrize("code", ["ResourceNotFoundException", "AccessDeniedException"])
def test_a_missing_or_refusing_table_names_its_setting(code: str) -> None:
    table = ControlTable(_client("dynamodb", "get_item", code, 400, 1), "lm-table")
    with pytest.raises(ResourceAccessError, match="LM_TABLE"):
        table.get("p", "s")
