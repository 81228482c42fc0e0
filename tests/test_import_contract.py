"""The import contract (``lint-imports``, run by make lint) catches what it forbids: a copy of
the package with one forbidden import per contract breaks every contract (the negative
control of the contract make lint keeps)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import rolloutcore

REPO = Path(__file__).resolve().parents[1]
#: contract name (as pyproject.toml states it) -> (module to add, its forbidden import)
VIOLATIONS = {
    "The spec is pure: it imports nothing else of the project":
        ("spec/_forbidden.py", "import rolloutcore.fleet\n"),
    "Only the adapters and the conformance kit touch vLLM":
        ("fleet/_forbidden.py", "import vllm\n"),
    "The product imports no test fixture and no demo (the CLI's demo command aside)":
        ("rl/_forbidden.py", "from rolloutcore.conformance.fixtures import tiny_model\n"),
    "The checkers read only the spec, the journal and the evidence they re-decide":
        ("check/_forbidden.py", "import rolloutcore.fleet.base\n"),
}


def test_every_contract_breaks_on_a_forbidden_import(tmp_path: Path) -> None:
    pkg = tmp_path / "rolloutcore"
    shutil.copytree(Path(rolloutcore.__file__).parent, pkg, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "traces", "*.md"))
    for module, line in VIOLATIONS.values():
        (pkg / module).write_text(line)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    for name in VIOLATIONS:
        assert f"{name} BROKEN" in out.stdout, (name, out.stdout[-3000:])
    assert "0 kept, 4 broken" in out.stdout, out.stdout[-1000:]
