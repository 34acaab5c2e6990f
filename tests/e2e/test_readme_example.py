"""The README's Python example runs as pasted (only its address is pointed at a test server),
as a separate process, and prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.proc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### From Python", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert m, "README.md has no Python example under 'From Python'"
    return m.group(1)


def test_the_readme_python_example_runs(tmp_path):
    code = readme_example()
    assert code.count("127.0.0.1:9007") == 2  # the address of `./run serve`, nothing else
    srv = ServerProcess(tmp_path / "srv", topics=("orders",)).start()
    try:
        script = tmp_path / "hello.py"
        script.write_text(code.replace("127.0.0.1:9007", f"127.0.0.1:{srv.port}"))
        run = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert run.returncode == 0, run.stderr
        assert re.fullmatch(r'orders \d+\|1\| \{"sym":"ACME","px":12\.5\}\n', run.stdout), (
            run.stdout
        )
    finally:
        srv.kill()
