"""The security HTTP surface under API_PREFIX: the tenant's security policy, admin only (thin
handlers over `security`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from specops_schemas.api import API_PREFIX
from specops_schemas.security import SECURITY_ADR, PolicySettings, SecurityPolicy
from specops_services.gateway.http.auth import Admin, Viewer, pool_of
from specops_services.gateway.http.problems import responses
from specops_services.gateway.idempotency import json_reply
from specops_services.gateway.security import service as security

router = APIRouter(prefix=API_PREFIX, tags=["security"])

ADR_NOTE = f"What each tier guarantees, the side channels and their mitigations: `{SECURITY_ADR}` (F-S5)."


@router.get(
    "/security/policy",
    response_model=SecurityPolicy,
    summary="The tenant's security policy",
    description=(
        "The caller's tenant's tier, timing jitter (F-S2), speculation opt-out (F-S3) and monthly GPU "
        "budget; version 0 is the default policy of a tenant that never set one. Admin only. " + ADR_NOTE
    ),
    responses=responses(401, 403, 500, 503),
)
async def get_policy(request: Request, principal: Admin) -> SecurityPolicy:
    return await security.read_policy(pool_of(request), principal)


@router.put(
    "/security/policy",
    response_model=SecurityPolicy,
    summary="Change the tenant's security policy",
    description=(
        "Admin only: any other role gets a 403 and the refusal is audited (`security.refused`). The "
        "security service applies the change and announces it (`security.policy_changed`, audited); "
        "200 with the new policy once applied, 202 with the policy still in force if that takes longer "
        "than the gateway waits (GET it again shortly). `speculation_opt_out` needs the "
        "`multi_tenant_isolated` tier (422 otherwise). " + ADR_NOTE
    ),
    responses={
        202: {"model": SecurityPolicy, "description": "Asked for; not applied yet (the policy in force)."},
        **responses(400, 401, 403, 422, 500, 503),
    },
)
async def put_policy(body: PolicySettings, request: Request, principal: Viewer) -> JSONResponse:
    wait_s = request.app.state.settings.gateway_policy_wait_s
    return json_reply(await security.put_policy(pool_of(request), principal, body, wait_s=wait_s))
