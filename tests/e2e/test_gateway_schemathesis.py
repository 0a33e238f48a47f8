"""Property-based checks of the gateway against its own published OpenAPI spec.

A real uvicorn server and Redis; no worker is needed (the models are registered, so
submits are accepted and stay pending). Beyond "no 5xx", responses must match the
documented status codes and schemas. A few examples per operation keep it fast."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration
from tests.e2e.test_gateway import AUTH, NS
from tests.e2e.test_gateway import settings as gateway_settings
from tests.support.gateway_main import live_gateway

pytestmark = pytest.mark.e2e


async def test_no_operation_answers_a_server_error(redis_url: str) -> None:
    registry = open_model_registry(redis_url, Names(NS))
    for model in ("demo-mlp", "demo-encoder"):
        await registry.declare(model, Declaration(0.0))
    await registry.close()
    with live_gateway(gateway_settings(redis_url)) as base:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        assert len(operations) >= 6
        for operation in operations:
            @given(case=operation.as_strategy())
            @settings(max_examples=25, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
                response = case.call(base_url=base, headers=AUTH, timeout=10)
                # Every default check but positive_data_acceptance: the spec cannot say
                # "a non-ragged nested array of numbers", so some schema-valid inputs get 422.
                case.validate_response(response, excluded_checks=[positive_data_acceptance])

            check()
