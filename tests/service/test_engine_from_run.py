"""`specops serve engine --from-run`: the gateway (real PostgreSQL and nats-server, on uvicorn)
answers a speccore run from its winner cache; the engine server fetches that run's winner and
serves it; a run that is not completed is refused with a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import psycopg
import pytest
from fixtures.engine import engine_server
from fixtures.gateway import ServerThread, gateway_settings
from psycopg.types.json import Jsonb

from specops.cli import main as specops
from specops.client import SpeculativeClient
from specops_schemas.candidates import Candidate, CandidateResult, Measurement, Prediction
from specops_schemas.catalog import Role
from specops_services.gateway.app import create_app
from specops_services.gateway.http.tokens import issue_token

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
TARGET = {"model_ref": MODEL, "gpu": "cpu", "engine": "speccore"}
NGRAM = Candidate(candidate_id="ngram-k3", family="ngram", k=3, options={"ngram_max": 3})
WINNER = CandidateResult(
    candidate=NGRAM,
    prediction=Prediction(
        rank=1, score=1.0, acceptance_rate=0.4, mean_acceptance_length=1.6, speedup=1.2, extra_memory_bytes=0
    ),
    measurement=Measurement(
        candidate_id="ngram-k3",
        reps=1,
        tokens_per_s=12.0,
        tokens_per_s_stdev=0.0,
        speedup=1.2,
        acceptance_rate=0.4,
        mean_acceptance_length=1.6,
        per_position_acceptance=[0.5, 0.4, 0.3],
        ttft_s=0.1,
        tpot_s=0.05,
        extra_memory_bytes=0,
    ),
)


def _cache_winner(dsn: str) -> None:
    """A measured speccore winner for (smollm2, cpu, chat) in tenant acme's winner cache."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO winner_cache (cache_scope, model_ref, gpu, engine, engine_version, fingerprint,
                   mode, quality_gate, winner, candidates, pareto_front, measured)
               VALUES ('acme', %s, 'cpu', 'speccore', '', 'chat', 'interactive', 'topk5',
                   %s, %s, %s, true)""",
            (
                MODEL,
                Jsonb(WINNER.model_dump(mode="json")),
                Jsonb([WINNER.model_dump(mode="json")]),
                Jsonb([]),
            ),
        )


def test_serve_engine_from_run_serves_the_runs_winner(
    db: str, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = asyncio.run(issue_token(db, tenant_id="acme", role=Role.DEVELOPER)).secret
    _cache_winner(db)
    with ServerThread(create_app(gateway_settings(db, nats_url))) as gateway:
        with SpeculativeClient(gateway.url, token) as client:
            run = client.runs.create(target=TARGET, workload="chat", goal={"quality_gate": "topk5"})
            assert run.status == "completed" and run.winner == WINNER
            # Not completed: refused before any model is loaded.
            queued = client.runs.create(target={**TARGET, "gpu": "A100-80GB"}, workload="chat").id
        assert specops(["serve", "engine", "--from-run", queued, "--url", gateway.url, "--token", token]) == 2
        assert f"run {queued} is queued, not completed" in capsys.readouterr().err

        log = tmp_path / "engine.log"
        args = ["--from-run", run.id, "--url", gateway.url, "--token", token]
        with (
            engine_server(args, log) as server,
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="-") as engine,
        ):
            assert [m.id for m in engine.models.list()] == [MODEL]
            reply = engine.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=8, temperature=0)
            assert reply.choices[0].text
        assert (
            f"serving run {run.id}'s winner ngram-k3 on {MODEL} (ngram, k=3, tree -, knobs {{"
            in log.read_text()
        )
        assert "'ngram_max': 3" in log.read_text()
