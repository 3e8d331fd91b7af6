"""`POST datastores`, `GET datastores[/{id}]`: a tenant's corpora for the rest family.

An upload is the raw body (no multipart): `text/plain` is one document, `application/jsonl`
or `application/x-ndjson` one document per record. It is streamed to a temporary file in
the tenant's part of the artifact store while it is hashed and counted (its own limit,
`SPECOPS_DATASTORE_MAX_BYTES`, in place of the gateway's body limit), checked, and
renamed to its content address (speccatalog.artifacts). The row and its
`registry.datastore_registered` are written in one tenant transaction; the same bytes
uploaded again by the tenant are the same datastore (200, nothing published). That makes
a retried upload safe without an Idempotency-Key, which would need the whole body in
memory to fingerprint the request.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from specbus import outbox
from specbus.envelope import Envelope, new_event
from speccatalog import artifacts
from speccore.datastore import record_text
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Fingerprint
from specops_schemas.registry import (
    CorpusFormat,
    DatastoreList,
    DatastoreRegistered,
    DatastoreResponse,
)
from specops_services.gateway import results, security
from specops_services.gateway.datastores import db as datastore_db
from specops_services.gateway.datastores import logic as datastore_logic
from specops_services.gateway.http.auth import Developer, Viewer, pool_of
from specops_services.gateway.http.problems import ProblemError, problem, responses
from specops_services.gateway.http.uploads import READ_CHUNK, receive, settle
from specplatform.db import Connection, tenant_transaction

router = APIRouter(prefix=API_PREFIX, tags=["datastores"])

DATASTORES_PATH = f"{API_PREFIX}/datastores"
MEDIA_TYPES: dict[str, CorpusFormat] = {
    "text/plain": "text",
    "application/jsonl": "jsonl",
    "application/x-ndjson": "jsonl",
}

DatastoreId = Annotated[
    str, PathParam(description="Datastore id (`ds-<hex>`), as `POST datastores` returned.")
]


def datastore_location(ds_id: str) -> str:
    return f"{DATASTORES_PATH}/{ds_id}"


@router.post(
    "/datastores",
    status_code=201,
    response_model=DatastoreResponse,
    summary="Upload a corpus for the rest family",
    description=(
        "The body is the corpus itself: `text/plain` (one document) or `application/jsonl` / "
        '`application/x-ndjson` (one JSON object per line: its `"text"`, or `"prompt"` + `"completion"`). '
        "201 with `Location` for a new datastore; 200 when the tenant uploaded the same bytes before. "
        "The tenant's `rest` candidates then draft from it (its id is their `draft`)."
    ),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {media: {"schema": {"type": "string"}} for media in MEDIA_TYPES},
        }
    },
    responses={
        200: {"model": DatastoreResponse, "description": "The tenant uploaded this corpus already."},
        **responses(401, 403, 413, 415, 422, 500, 503),
    },
)
async def upload_datastore(
    request: Request,
    principal: Developer,
    name: Annotated[str, Query(min_length=1, max_length=200, description="A name for the corpus.")],
    fingerprints: Annotated[
        str | None, Query(description="Comma-separated workloads it serves, e.g. `code,rag`; default any.")
    ] = None,
) -> JSONResponse:
    if "\x00" in name:
        raise problem(
            422, "name must not contain the NUL character (U+0000)", type="urn:specops:problem:invalid-text"
        )
    fmt = _format(request.headers.get("content-type"))
    workloads = _fingerprints(fingerprints)
    settings = request.app.state.settings
    root: Path = settings.artifact_root
    tenant = principal.tenant_id
    tmp, sha256, size = await receive(
        request, root / artifacts.DATASTORES_DIR / tenant, settings.datastore_max_bytes
    )
    try:
        documents = await asyncio.to_thread(count_documents, tmp, fmt)
        relative = artifacts.corpus_path(tenant, sha256, fmt)
        registered = _registered(tenant, name, sha256, size, fmt, documents, workloads, relative)
        async with pool_of(request).connection() as conn, tenant_transaction(conn, tenant):
            created = await _record(conn, registered, tmp, root / relative)
            row = await datastore_db.find_datastore(conn, tenant, registered.payload.datastore_id)
    except CorpusError as exc:
        raise _invalid(str(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)
    ds_id = registered.payload.datastore_id
    if row is None:
        raise RuntimeError(f"datastore {ds_id} was not recorded")
    body = _response(row).model_dump(mode="json")
    return JSONResponse(
        body, status_code=201 if created else 200, headers={"Location": datastore_location(ds_id)}
    )


@router.get(
    "/datastores",
    response_model=DatastoreList,
    summary="The tenant's datastores",
    responses=responses(401, 403, 500, 503),
)
async def list_datastores(request: Request, principal: Viewer) -> DatastoreList:
    async with pool_of(request).connection() as conn, tenant_transaction(conn, principal.tenant_id):
        rows = await datastore_db.list_datastores(conn, principal.tenant_id)
    return DatastoreList(datastores=[_response(r) for r in rows])


@router.get(
    "/datastores/{datastore_id}",
    response_model=DatastoreResponse,
    summary="One datastore of the tenant",
    responses=responses(401, 403, 404, 500, 503),
)
async def get_datastore(datastore_id: DatastoreId, request: Request, principal: Viewer) -> DatastoreResponse:
    async with pool_of(request).connection() as conn, tenant_transaction(conn, principal.tenant_id):
        row = await datastore_db.find_datastore(conn, principal.tenant_id, datastore_id)
    if row is None:
        raise problem(404, "no datastore with that id in this tenant")
    return _response(row)


# --- the upload ----------------------------------------------------------------------------------


def _registered(
    tenant: str,
    name: str,
    sha256: str,
    size: int,
    fmt: CorpusFormat,
    documents: int,
    workloads: list[Fingerprint],
    relative: str,
) -> Envelope[DatastoreRegistered]:
    ds_id = artifacts.datastore_id(tenant, sha256)
    return new_event(
        DatastoreRegistered(
            datastore_id=ds_id,
            name=name,
            sha256=sha256,
            size_bytes=size,
            format=fmt,
            documents=documents,
            fingerprints=workloads,
            path=relative,
        ),
        tenant_id=tenant,
        correlation_id=ds_id,
        producer=results.PRODUCER,
    )


async def _record(
    conn: Connection, registered: Envelope[DatastoreRegistered], tmp: Path, final: Path
) -> bool:
    """Settle and record a new datastore within the tenant's storage quota (413 beyond it);
    False for bytes the tenant uploaded before, which take no more room.

    Under the tenant's upload lock, so that parallel uploads are counted one after the other,
    and the corpus is moved into place only once it is sure to be recorded."""
    tenant = registered.tenant_id
    await datastore_db.lock_tenant(conn, tenant)
    if await datastore_db.find_datastore(conn, tenant, registered.payload.datastore_id) is not None:
        return False
    policy = await security.tenant_policy(conn, tenant)
    usage = await datastore_db.usage(conn, tenant)
    over = datastore_logic.over_quota(policy, usage, registered.payload.size_bytes)
    if over is not None:
        raise problem(413, over.detail, type=datastore_logic.OVER_QUOTA, **over.extras())
    await asyncio.to_thread(settle, tmp, final)
    await datastore_db.insert_datastore(conn, registered)
    await outbox.add(conn, registered)
    return True


# --- the corpus ----------------------------------------------------------------------------------


class CorpusError(ValueError):
    """The uploaded corpus is not one specops can index; the message says where and why."""


def _format(content_type: str | None) -> CorpusFormat:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    fmt = MEDIA_TYPES.get(media)
    if fmt is None:
        raise problem(
            415,
            f"a corpus is sent as {', '.join(MEDIA_TYPES)}; got {media or 'no Content-Type'}",
            type="urn:specops:problem:unsupported-media-type",
        )
    return fmt


def _fingerprints(raw: str | None) -> list[Fingerprint]:
    names = [part.strip() for part in (raw or "").split(",") if part.strip()]
    try:
        return sorted({Fingerprint(n) for n in names})
    except ValueError:
        known = ", ".join(Fingerprint)
        raise _invalid(f"fingerprints must name workloads among {known}; got {raw!r}") from None


def _invalid(detail: str) -> ProblemError:
    return problem(422, detail, type="urn:specops:problem:invalid-corpus")


def count_documents(path: Path, fmt: CorpusFormat) -> int:
    """Documents of a corpus file; CorpusError if it is not UTF-8, not JSONL or holds none."""
    if fmt == "text":
        documents = 1 if _has_text(path) else 0
    else:
        documents = 0
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, start=1):
                documents += _record_documents(lineno, raw)
    if documents == 0:
        raise CorpusError("the corpus is empty: it holds no text")
    return documents


def _has_text(path: Path) -> bool:
    with path.open(encoding="utf-8") as f:
        try:
            while chunk := f.read(READ_CHUNK):
                if chunk.strip():
                    return True
        except UnicodeDecodeError as exc:
            raise CorpusError(f"the corpus is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return False


def _record_documents(lineno: int, raw: bytes) -> int:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorpusError(f"line {lineno}: not UTF-8 text") from None
    if not line.strip():
        return 0
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"line {lineno}: not valid JSON ({exc.msg})") from None
    doc = record_text(record)
    if doc is None:
        raise CorpusError(f'line {lineno}: need an object with "text", or "prompt" and "completion"')
    return 1 if doc.strip() else 0


def _response(row: dict[str, Any]) -> DatastoreResponse:
    return DatastoreResponse(
        id=row["id"],
        name=row["name"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        format=row["format"],
        documents=row["documents"],
        fingerprints=[Fingerprint(f) for f in row["fingerprints"]],
        created_at=row["created_at"],
    )
