import json
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = FIX / "captures"
SNAPSHOTS = FIX / "snapshots"


def capture(host: str, name: str) -> str:
    """Body of a capture_host.sh file: without its `$ cmd` first line and `# rc=N` last line."""
    lines = (CAPTURES / host / name).read_text().splitlines()
    return "\n".join(lines[1:-1]) + "\n"


def capture_rc(host: str, name: str) -> int:
    return int((CAPTURES / host / name).read_text().strip().splitlines()[-1].split("=")[1])


@pytest.fixture
def snapshot_doc():
    def load(name):
        return json.loads((SNAPSHOTS / f"{name}.json").read_text())
    return load
