"""The tenant's storage quota, without I/O: whether one more datastore fits its security policy.

Both limits answer 413 rather than 429: the space does not free itself with time (a tenant's
datastores stay until removed), so a `Retry-After` would promise what waiting cannot give.
"""

from __future__ import annotations

from dataclasses import dataclass

from specops_schemas.security import PolicySettings

OVER_QUOTA = "urn:specops:problem:storage-quota-exceeded"


@dataclass(frozen=True, slots=True)
class Usage:
    """What the tenant's datastores hold now."""

    bytes: int
    datastores: int


@dataclass(frozen=True, slots=True)
class OverQuota:
    """Why an upload is refused, with the numbers the problem carries."""

    detail: str
    quota_bytes: int
    used_bytes: int
    upload_bytes: int
    max_datastores: int
    datastores: int

    def extras(self) -> dict[str, int]:
        return {
            "quota_bytes": self.quota_bytes,
            "used_bytes": self.used_bytes,
            "upload_bytes": self.upload_bytes,
            "max_datastores": self.max_datastores,
            "datastores": self.datastores,
        }


def over_quota(policy: PolicySettings, usage: Usage, upload_bytes: int) -> OverQuota | None:
    """The refusal of a new datastore of `upload_bytes`, or None when it fits the policy."""
    quota = policy.storage_quota_bytes
    if upload_bytes > quota:
        detail = (
            f"the corpus ({upload_bytes} bytes) is larger than the tenant's whole storage quota "
            f"({quota} bytes)"
        )
    elif usage.bytes + upload_bytes > quota:
        detail = (
            f"the corpus ({upload_bytes} bytes) would take the tenant over its storage quota: "
            f"{usage.bytes} of {quota} bytes are used, {quota - usage.bytes} left"
        )
    elif usage.datastores + 1 > policy.max_datastores:
        detail = (
            f"the tenant holds {usage.datastores} datastores, its policy's limit ({policy.max_datastores})"
        )
    else:
        return None
    return OverQuota(
        detail=detail,
        quota_bytes=quota,
        used_bytes=usage.bytes,
        upload_bytes=upload_bytes,
        max_datastores=policy.max_datastores,
        datastores=usage.datastores,
    )
