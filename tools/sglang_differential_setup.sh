#!/bin/bash
# The reference venv for tools/sglang_differential.py: sglang 0.5.23 (no deps) + torch, then each module its
# import names (bounded loop), then what resolution imports lazily and the transformers/tokenizers sglang pins.
# Never a gpudoctor dependency: keep the venv outside the repository.
VENV=${1:-/tmp/sglang-ref}
PY=$VENV/bin/python
[ -x $PY ] || { python3 -m venv $VENV && $VENV/bin/pip install -q --no-deps sglang==0.5.23 && $VENV/bin/pip install -q torch==2.13.0; }
declare -A MAP=( [yaml]=pyyaml [PIL]=pillow [zmq]=pyzmq [google]=protobuf [sklearn]=scikit-learn [cv2]=opencv-python-headless [attr]=attrs [dateutil]=python-dateutil [jwt]=pyjwt [msgspec]=msgspec [huggingface_hub]=huggingface_hub [sentencepiece]=sentencepiece [fastapi]=fastapi [uvloop]=uvloop [orjson]=orjson [pybase64]=pybase64 [setproctitle]=setproctitle [partial_json_parser]=partial_json_parser [openai_harmony]=openai-harmony [compressed_tensors]=compressed-tensors [llguidance]=llguidance [xgrammar]=xgrammar [outlines]=outlines [triton]=triton [einops]=einops [blake3]=blake3 [cuda]=cuda-python [sgl_kernel]=sglang-kernel [flashinfer]=flashinfer-python [tvm_ffi]=apache-tvm-ffi )
for i in $(seq 1 40); do
  out=$(timeout 300 $PY -c "from sglang.srt.server_args import prepare_server_args; import sglang.srt.arg_groups.pipeline; import sglang.srt.arg_groups.speculative_hook; print('IMPORT_OK')" 2>&1)
  if echo "$out" | grep -q IMPORT_OK; then
    echo "IMPORT OK after $i"
    # imported during resolution, not at import time; then the versions sglang 0.5.23 pins
    $VENV/bin/pip install -q openai partial_json_parser einops transformers==5.19.0 tokenizers==0.23.2
    exit 0
  fi
  mod=$(echo "$out" | grep -o "No module named '[^']*'" | tail -1 | sed "s/No module named '\([^'.]*\).*/\1/")
  if [ -z "$mod" ]; then echo "OTHER ERROR:"; echo "$out" | tail -15; exit 1; fi
  pkg=${MAP[$mod]:-$mod}
  echo "[$i] missing $mod -> pip install $pkg"
  $VENV/bin/pip install -q "$pkg" 2>&1 | grep -v "is ignored" | tail -2
done
echo GAVE UP; exit 1
