"""Campaign files for tests: the stand-in is the server command, so every run launches real processes."""

from __future__ import annotations

import sys
import textwrap

from tests.bench.conftest import free_port


def write(tmp_path, body: str, *, port: int | None = None, gate: str = '"true"', name: str = "c.yaml",
          concurrency: str = "[1, 2]", extra: str = "") -> tuple:
    port = port or free_port()
    for d in ("model", "draft"):  # a run checks that the paths it gives the server exist
        (tmp_path / d).mkdir(exist_ok=True)
    text = textwrap.dedent(f"""\
        name: test
        model: {tmp_path}/model
        server:
          command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "400", --ttft-ms, "10"]
          port: {port}
        gate:
          command: {gate}
        tp: [1]
        concurrency: {concurrency}
        timeouts: {{ready_s: 90, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
        workloads:
          - name: chat
            max_tokens: [24]
            num_prompts: 4
        """) + textwrap.dedent(body) + textwrap.dedent(extra)
    path = tmp_path / name
    path.write_text(text)
    return path, port
