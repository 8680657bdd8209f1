#!/usr/bin/env bash
# Builds, here (network to the package index), the carry pack for the GPU machine: what an ActorQ run needs and
# that machine's Python 3.12 lacks (bench/gpu/machine-packages.txt), at requirements-py312.lock's versions, as
# cp312 manylinux wheels. Written to bench/gpu/pack/ (git-ignored), at most 40 MiB:
#   wheels/*.whl        the packages carried whole (pure Python, or small binary ones)
#   trimmed.tar.xz      ray, mujoco, dm_control, tfp-nightly and PyOpenGL installed for cp312 (pip --target) and
#                       trimmed to what a run imports: ray without jars, the dashboard client, rllib, serve, data,
#                       llm, tune and train; mujoco without experimental/, filament or simulate; dm_control without
#                       locomotion/ (so without labmaze, which only it imports), the dog assets, manipulation,
#                       composer or blender; every shared object stripped. tfp and PyOpenGL are whole, but xz packs
#                       their many source files 5x tighter than their wheels (tfp: 1.4 MB against 7 MB)
#   MANIFEST.txt        name==version of everything in the pack
# On the GPU machine bench/gpu/install.sh installs it without network (bench/gpu/e2e.sh, bench/gpu/run.sh).
#   bash bench/gpu/pack.sh            # PIP=... to use another pip (default: the project venv's)
set -euo pipefail
cd "$(dirname "$0")"
PIP=${PIP:-$(cd ../.. && pwd)/.venv/bin/pip}
[ -x "$PIP" ] || PIP=$(command -v pip3)
LOCK=../../requirements-py312.lock
NODEPS_LOCK=../../requirements-nodeps.lock  # gymnax (launch.anakin): installed --no-deps, as the Makefile does
LIMIT_MIB=40
# Carried whole: what `import launch.distributed.supervisor, bench.system.e2e` and the nodes load beyond the machine's packages.
WHEELS="aqtp decorator distrax dm-env dm-haiku dm-tree Farama-Notifications gast glfw gymnasium gymnax jmp jsonschema
  jsonschema-specifications referencing rlax rpds-py tensorboardX websockets"
TRIMMED="ray mujoco dm_control tfp-nightly PyOpenGL"
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_28_x86_64 --platform any)

pin() {  # NAME -> NAME==VERSION from the 3.12 lock, else the no-deps lock (names compared as pip does: case, - and _ alike)
  local key
  key=$(echo "$1" | tr 'A-Z_' 'a-z-')
  awk -F'==' -v k="$key" '!/^#/ { n = tolower($1); gsub("_", "-", n); if (n == k) { print; exit } }' "$LOCK" "$NODEPS_LOCK" \
    | grep . || { echo "pack.sh: $1 is in neither requirements-py312.lock nor requirements-nodeps.lock" >&2; exit 2; }
}

rm -rf pack && mkdir -p pack/wheels
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
for name in $WHEELS; do
  "$PIP" download --quiet --no-deps "${TARGET[@]}" --dest pack/wheels "$(pin "$name")"
done
pins=()
for name in $TRIMMED; do pins+=("$(pin "$name")"); done
"$PIP" install --quiet --no-deps --no-compile "${TARGET[@]}" --target "$STAGE/site" "${pins[@]}"
(
  cd "$STAGE/site"
  rm -rf ray/jars ray/dashboard/client ray/rllib ray/serve ray/data ray/llm ray/tune ray/train bin
  rm -rf mujoco/experimental mujoco/filament mujoco/simulate mujoco/*simulate* mujoco/*filament*
  rm -rf dm_control/locomotion dm_control/suite/dog_assets dm_control/manipulation dm_control/composer \
    dm_control/blender dm_control/entities
  find . -name '__pycache__' -prune -exec rm -rf {} +
  find . -type f \( -name '*.so' -o -name '*.so.*' -o -path '*/core/src/ray/*' \) -exec sh -c \
    'file -b "$1" | grep -q ELF && strip --strip-unneeded "$1" 2>/dev/null || true' _ {} \;
)
tar -C "$STAGE/site" -cf - . | xz -9 -T0 > "$STAGE/trimmed.tar.xz"
mv "$STAGE/trimmed.tar.xz" pack/trimmed.tar.xz
{  # written last: a pack without it is incomplete (smoke.sh rebuilds it)
  for w in pack/wheels/*.whl; do basename "$w" | awk -F- '{print $1 "==" $2}'; done
  for p in "${pins[@]}"; do echo "$p (trimmed)"; done
} > "$STAGE/MANIFEST.txt"
mv "$STAGE/MANIFEST.txt" pack/MANIFEST.txt
size=$(du -sm pack | cut -f1)
du -shc pack/wheels pack/trimmed.tar.xz
if [ "$size" -gt "$LIMIT_MIB" ]; then
  echo "pack.sh: the pack is ${size} MiB, over its ${LIMIT_MIB} MiB limit" >&2
  exit 1
fi
