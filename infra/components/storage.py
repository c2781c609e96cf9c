"""The acceptance authority's bucket, its protocol-enforcing bucket policy, the GC role, the ops bucket.

Everything here comes from :class:`lightmetrics.deployment.resource_types.BucketSpec`; every prefix is inside
the configured prefix namespace.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from lightmetrics.deployment.resource_types import BucketSpec

#: Prefixes of the ops bucket (it is not an authority: no protocol rules apply there).
INVENTORY_PREFIX = "inventory"
ACCESS_LOGS_PREFIX = "access-logs/authority/"
INVENTORY_ID = "weekly-parquet"

INVENTORY_FIELDS = (
    "Size",
    "LastModifiedDate",
    "ETag",
    "StorageClass",
    "IsMultipartUploaded",
    "ChecksumAlgorithm",
)


def objects(bucket_arn: str, namespace: str, prefixes: tuple[str, ...] | list[str]) -> list[str]:
    """Object ARNs ``<bucket>/<namespace><prefix>*`` for each layout prefix."""
    return [f"{bucket_arn}/{namespace}{p}*" for p in prefixes]


def protocol_statements(spec: BucketSpec, bucket_arn: str, namespace: str, gc_role_arn: str) -> list[iam.PolicyStatement]:
    """The bucket-policy statements that enforce the protocol (docs/protocol.md §3), TLS aside.

    * every write under the layout is a conditional create (``If-None-Match``);
    * multipart only where allowed: there CreateMultipartUpload/UploadPart/UploadPartCopy are
      exempt (they cannot carry the header; ``s3:ObjectCreationOperation`` is false for them)
      and CompleteMultipartUpload must carry it; under ``accepted/v1/`` multipart is denied;
    * no server-side copies into the layout;
    * no deletes of acceptance records, evidence, resolutions, retention markers; raw blobs
      only by the GC role.
    """
    create_only = list(spec.create_only_prefixes)
    multipart = [p for p in create_only if p in spec.multipart_prefixes]
    single_part = [p for p in create_only if p not in spec.multipart_prefixes]
    put, deletes = ["s3:PutObject"], ["s3:DeleteObject", "s3:DeleteObjectVersion"]

    def deny(sid: str, actions: list[str], prefixes: Any, conditions: dict[str, Any] | None = None) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid=sid,
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=actions,
            resources=objects(bucket_arn, namespace, prefixes),
            conditions=conditions,
        )

    statements = [deny("DenyPutWithoutIfNoneMatch", put, single_part, {"Null": {"s3:if-none-match": "true"}})]
    if multipart:
        # Only CompleteMultipartUpload carries If-None-Match: part uploads are exempt.
        statements.append(deny("DenyPutWithoutIfNoneMatchMultipartExempt", put, multipart,
                               {"Null": {"s3:if-none-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}))
    if spec.no_multipart_enforced_prefixes:
        statements.append(deny("DenyMultipartUnderAccepted", put, spec.no_multipart_enforced_prefixes,
                               {"Bool": {"s3:ObjectCreationOperation": "false"}}))
    statements += [
        deny("DenyCopyIntoLayout", put, create_only, {"Null": {"s3:x-amz-copy-source": "false"}}),
        deny("DenyDeletePermanentRecords", deletes, spec.no_delete_prefixes),
        deny("DenyRawBlobDeleteExceptGcRole", deletes, spec.gc_delete_prefixes,
             {"ArnNotEquals": {"aws:PrincipalArn": gc_role_arn}}),
    ]
    return statements


class Storage(Construct):
    """Authority bucket + bucket policy + GC role, and the ops bucket (inventory, access logs)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: BucketSpec,
        namespace: str,
        bucket_name: str | None,
        noncurrent_version_days: int,
        abort_multipart_days: int,
        ops_retention_days: int,
        inventory_retention_days: int = 14,
        inventory: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        self.spec = spec
        self.namespace = namespace

        # Inventory reports and server access logs. Not versioned: reports and logs are
        # regenerated/append-only. Access logs expire after ops_retention_days; inventory reports
        # after inventory_retention_days (the weekly audit reads only the latest; at a year of
        # history a report is ~90 B x every object, so keeping 90 days of them cost more than the audit).
        self.ops_bucket = s3.Bucket(
            self,
            "OpsBucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireInventoryReports",
                    prefix=INVENTORY_PREFIX + "/",
                    expiration=Duration.days(inventory_retention_days),
                ),
                s3.LifecycleRule(
                    id="ExpireOpsData",
                    expiration=Duration.days(ops_retention_days),
                    abort_incomplete_multipart_upload_after=Duration.days(abort_multipart_days),
                ),
            ],
        )
        _stable_id(self.ops_bucket, "OpsBucket")

        lifecycle = [
            s3.LifecycleRule(
                id="AbortIncompleteMultipartUploads",
                abort_incomplete_multipart_upload_after=Duration.days(abort_multipart_days),
            )
        ]
        for prefix in spec.noncurrent_expiry_prefixes:
            lifecycle.append(
                s3.LifecycleRule(
                    id="ExpireNoncurrent-" + prefix.rstrip("/").replace("/", "-"),
                    prefix=namespace + prefix,
                    noncurrent_version_expiration=Duration.days(noncurrent_version_days),
                    expired_object_delete_marker=True,
                )
            )

        self.bucket = s3.Bucket(
            self,
            spec.logical_name,
            bucket_name=bucket_name,
            versioned=spec.versioned,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=lifecycle,
            server_access_logs_bucket=self.ops_bucket,
            server_access_logs_prefix=ACCESS_LOGS_PREFIX,
            # Weekly, all versions: the audit's input (docs/pipeline.md). Without it (config
            # ``inventory: false``) the weekly walk proves completeness instead (docs/walks.md).
            inventories=[
                s3.Inventory(
                    inventory_id=INVENTORY_ID,
                    destination=s3.InventoryDestination(bucket=self.ops_bucket, prefix=INVENTORY_PREFIX),
                    frequency=s3.InventoryFrequency.WEEKLY,
                    format=s3.InventoryFormat.PARQUET,
                    include_object_versions=s3.InventoryObjectVersion.ALL,
                    objects_prefix=namespace or None,
                    optional_fields=list(INVENTORY_FIELDS),
                )
            ] if inventory else None,
        )
        _stable_id(self.bucket, spec.logical_name)

        # The one principal allowed to delete raw blobs (docs/protocol.md §15). Reap functions that set
        # FunctionSpec.gc_role run as this role; their permissions are attached when they exist.
        self.gc_role = iam.Role(
            self,
            "GcRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Lightmetrics GC: the only principal the bucket policy lets delete raw blobs",
        )

        for statement in protocol_statements(spec, self.bucket.bucket_arn, namespace, self.gc_role.role_arn):
            self.bucket.add_to_resource_policy(statement)

    def object_arns(self, prefixes: tuple[str, ...] | list[str]) -> list[str]:
        return objects(self.bucket.bucket_arn, self.namespace, prefixes)


def _stable_id(bucket: s3.Bucket, logical_id: str) -> None:
    """Pin a stateful resource's logical id: refactoring constructs must never replace it."""
    cfn = bucket.node.default_child
    assert isinstance(cfn, s3.CfnBucket)
    cfn.override_logical_id(logical_id)
