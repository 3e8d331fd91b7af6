-- 024_predictor_head_exports: where a head's speculators export is (schemas/heads.py,
-- HeadArtifact.speculators). The head-trainer writes one beside each EAGLE-3 head it trains,
-- the layout vLLM loads; the predictor offers such a head to vLLM runs of its target too.
-- NULL: no export (another family, or a head trained before the trainer wrote them).

ALTER TABLE predictor_heads ADD COLUMN speculators_path text;
