# syntax=docker/dockerfile:1
# GPU image: CUDA, torch, SGLang (+ sglang-router), megatron-core, flash-linear-attention,
# Mooncake's transfer engine, Ray and slime with its runtime and megatron extras.
# Build with `bash docker/build.sh TAG`: every version comes from docker/images.yaml, the one
# place they are pinned, so this file names none of its own.
ARG CUDA_IMAGE

# ---- stage 1: a wheel of this checkout (no compilers or sources reach the final image) ---------
FROM ${CUDA_IMAGE} AS wheel
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build && /opt/build/bin/pip install --no-cache-dir build==1.3.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY lab ./lab
COPY slime ./slime
RUN /opt/build/bin/python -m build --wheel --outdir /dist .

# ---- stage 2: the runtime ----------------------------------------------------------------------
FROM ${CUDA_IMAGE}
ARG TORCH_CUDA_ARCH_LIST
ARG TORCH
ARG SGLANG
ARG SGLANG_ROUTER
ARG MEGATRON_CORE
ARG TRANSFORMERS
ARG RAY
ARG FLASH_LINEAR_ATTENTION
ARG MOONCAKE
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# libibverbs1 / rdma-core: Mooncake's RDMA transport; git: slime's provenance reads the checkout.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git libibverbs1 rdma-core \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}
# torch first and pinned, so SGLang's own pins resolve against it instead of replacing it.
RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir "torch==${TORCH}" \
 && pip install --no-cache-dir "sglang==${SGLANG}" "sglang-router==${SGLANG_ROUTER}" \
      "megatron-core==${MEGATRON_CORE}" "transformers==${TRANSFORMERS}" "ray[default]==${RAY}" \
      "flash-linear-attention==${FLASH_LINEAR_ATTENTION}" "mooncake-transfer-engine==${MOONCAKE}"
COPY --from=wheel /dist /tmp/dist
RUN pip install --no-cache-dir "$(ls /tmp/dist/*.whl)[runtime,megatron]" && rm -rf /tmp/dist
# The checkout's scripts, recipes and tools: experiment.sh runs from a slime root.
WORKDIR /opt/slime
COPY train.py train_async.py ./
COPY scripts ./scripts
COPY recipes ./recipes
COPY tools ./tools
COPY docker ./docker
# Ray on Kubernetes and on hand-started clusters runs as an ordinary user; GPU access comes from
# the device plugin, not from root.
RUN useradd --create-home --uid 1000 slime && chown -R slime:slime /opt/slime
USER 1000:1000
CMD ["ray", "--help"]
