# drover in one image: `drover worker`, `drover sim`, `drover flower`, `drover demo|submit|stats`.
# docker-compose.yml runs each of them as a service; any host can run the same image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /src

# The runtime dependencies first, read from pyproject.toml: a code change does not reinstall
# them. The demo extra (matplotlib for the orchestrator's plot) and the postgres extra (psycopg,
# for DROVER_RESULTS_URL) are in; test and benchmark extras stay out of the image.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['demo'] + p['optional-dependencies']['postgres']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Only the package that runs: the root's __init__.py (the package `drover`) and its four
# folders; tests, bench and docs are not copied (see .dockerignore).
COPY __init__.py ./
COPY config ./config
COPY workers ./workers
COPY orchestrator ./orchestrator
COPY simulator ./simulator
RUN pip install --no-deps . && rm -rf /src/build

# Never root: a worker runs model-chosen tool calls.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin drover \
    && mkdir -p /home/drover/out && chown drover:drover /home/drover/out
USER drover
WORKDIR /home/drover

EXPOSE 5555 8080
CMD ["drover", "--help"]
