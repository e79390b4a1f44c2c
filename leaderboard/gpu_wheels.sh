#!/usr/bin/env bash
# Here, before a GPU sweep (gpu_sweep.sh): the wheels of what the lent machine's image lacks (it holds torch,
# transformers, tensorboard, h5py, scikit-learn, pandas, ...; nothing can be fetched there), for its Python 3.12,
# into .whl/ (ignored by git; it travels with `carry: [".whl"]`, about 9 MB). Not rliable: only the page needs it,
# and the page is written here.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  diffusers==0.42.1 gymnasium==1.0.0 farama-notifications==0.0.6 minari==0.5.4 d3rlpy==2.8.1 gym-notices \
  dataclasses-json marshmallow structlog stable-baselines3==2.9.2 sb3-contrib==2.9.2
python3 -m pip wheel --quiet --no-deps -w .whl gym==0.26.2   # d3rlpy imports gym; it ships as a source archive only
du -sh .whl && ls .whl
