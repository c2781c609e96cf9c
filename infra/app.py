"""CDK entry point: ``cdk synth`` / ``cdk deploy`` run ``python -m infra.app`` (see cdk.json).

``build_app`` is also what the tests call, once per session, with the same context the CLI
would pass (``cdk.json``'s ``context`` plus overrides).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from aws_cdk import App, Aspects
from cdk_nag import AwsSolutionsChecks

from infra.config import InfraConfig, cdk_json_context
from infra.stack import LightmetricsStack


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[App, LightmetricsStack]:
    """The app with its one stack and the AwsSolutions checks (cdk-nag) as an aspect."""
    ctx = {**cdk_json_context(), **(context or {})}
    app = App(context=ctx, outdir=outdir) if outdir else App(context=ctx)
    config = InfraConfig.from_context(app.node.try_get_context)
    stack = LightmetricsStack(app, config.stack_name, config=config)
    Aspects.of(app).add(AwsSolutionsChecks(verbose=True, reports=False))
    return app, stack


def main() -> int:
    app, _stack = build_app()
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
