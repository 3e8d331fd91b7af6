"""Tenant artifacts the gateway registers: the HTTP bodies of `datastores` and the events of
`spec.registry.<id>.*`.

A *datastore* here is a customer corpus for the `rest` family (T2 with an uploaded corpus):
the raw text a tenant uploaded (`POST datastores`), kept in the content-addressed artifact
store at `datastores/<tenant>/<sha256>.<txt|jsonl>`. Its id is derived from (tenant,
sha256) (`specplatform.artifacts.datastore_id`), so the same upload twice is the same
datastore. The corpus is raw text: whoever measures a `rest` candidate on it (benchmark
runner, quality gate) indexes it with the target's tokenizer, once per tokenizer.

Flow: gateway -> `registry.datastore_registered` (correlation_id: the datastore id) ->
the predictor, which offers `rest` candidates with it (`Candidate.draft` = the id) in
that tenant's runs only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specbus.envelope import EventPayload
from specops_schemas.base import Model, UtcDatetime
from specops_schemas.catalog import Fingerprint

CorpusFormat = Literal["text", "jsonl"]
DATASTORE_ID_PATTERN = r"^ds-[0-9a-f]{24}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class DatastoreFields(Model):
    """What is known of an uploaded corpus, in the event and in the HTTP answer alike."""

    name: str = Field(min_length=1, max_length=200, description="The tenant's name for it (`?name=`).")
    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the uploaded bytes, hex.")
    size_bytes: int = Field(ge=1, description="Size of the uploaded corpus in bytes.")
    format: CorpusFormat = Field(
        description="`text`: the body is one document; `jsonl`: one document per record "
        '(its `"text"`, or `"prompt"` + `"completion"`).'
    )
    documents: int = Field(ge=1, description="Documents in the corpus.")
    fingerprints: list[Fingerprint] = Field(
        default_factory=list,
        description="Workloads the corpus serves (`?fingerprints=code,rag`); empty: any workload "
        "the rest family is offered for.",
    )


class DatastoreRegistered(DatastoreFields, EventPayload):
    """A tenant uploaded a corpus, stored in the artifact store (published by the gateway)."""

    event_type = "registry.datastore_registered"
    datastore_id: str = Field(
        pattern=DATASTORE_ID_PATTERN,
        description="`ds-<hex>`, derived from (tenant, sha256); the subject's id token and the "
        "`draft` of the rest candidates that use it.",
    )
    path: str = Field(
        min_length=1,
        max_length=512,
        description="The corpus file relative to the artifact store (`SPECOPS_ARTIFACT_DIR`): "
        "`datastores/<tenant>/<sha256>.<txt|jsonl>`.",
    )

    @property
    def aggregate_id(self) -> str:
        return self.datastore_id


class DatastoreResponse(DatastoreFields):
    """A datastore of the tenant (`POST datastores`, `GET datastores/{id}`)."""

    id: str = Field(pattern=DATASTORE_ID_PATTERN, description="The datastore id: a rest candidate's `draft`.")
    created_at: UtcDatetime = Field(description="When it was first uploaded.")


class DatastoreList(Model):
    """The tenant's datastores (`GET datastores`), newest first."""

    datastores: list[DatastoreResponse] = Field(description="Every datastore of the tenant, newest first.")


REGISTRY_EVENT_TYPES: tuple[type[EventPayload], ...] = (DatastoreRegistered,)
