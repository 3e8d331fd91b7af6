-- 016_predictor_heads: the T3 heads the predictor offers (schemas/heads.py).
--
-- The gateway is the registry's one writer (015_heads); every move of a head's lifecycle
-- is published as head.transitioned, carrying what the predictor needs to offer the head
-- (its target, family, artifact and the gate's measured acceptance). The predictor folds
-- those events into `predictor_heads`, one row per head, and offers a tenant's
-- `production` heads (and `uat` ones when a run asks, include_uat_heads) in that tenant's
-- runs of the head's target only. A move is applied only if it is not older than the one
-- the row holds, so events handled out of order leave the latest state.

CREATE TABLE predictor_heads (
    head_id         text PRIMARY KEY CHECK (head_id ~ '^hd-[0-9a-f]{24}$'),
    tenant_id       text NOT NULL,
    target_ref      text NOT NULL,
    family          text NOT NULL CHECK (family IN ('medusa', 'eagle', 'eagle3')),
    state           text NOT NULL,
    num_heads       integer,
    eagle_version   integer,
    params          bigint,
    artifact_path   text,
    acceptance_rate double precision,
    mean_acceptance_length double precision,
    transitioned_at timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX predictor_heads_by_tenant ON predictor_heads (tenant_id, state);
