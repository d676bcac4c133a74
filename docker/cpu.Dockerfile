# syntax=docker/dockerfile:1
# CPU image: the Quick Start lab and the tiny recipe's whole path (prepare, convert, train on Ray).
# Its install steps are README's commands, word for word (tests/lab/test_images.py checks it).
# Build with `bash docker/build.sh slimerl/slime:0.1.0-cpu`; versions come from docker/images.yaml.
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG TORCH
# Where a CPU-only torch index is at hand, pass it here to keep the image small.
ARG PIP_EXTRA_INDEX_URL=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# git: provenance reads the checkout; procps: `ray stop` and friends look at processes.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git procps \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 slime
WORKDIR /opt/slime
COPY --chown=slime:slime . .
USER 1000:1000
ENV PATH=/home/slime/.local/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_USER=1
# README, "Quick start" and "The tiny CPU recipe".
# hadolint ignore=DL3013
RUN test "${TORCH}" = 2.13.0 \
 && pip install -e . \
 && pip install torch==2.13.0 && pip install -e '.[runtime]'
EXPOSE 8765
CMD ["slime-lab", "--host", "0.0.0.0", "--port", "8765"]
