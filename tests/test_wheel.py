"""The built wheel carries the themes, the bench prompts and the stylesheet,
and they load through importlib.resources outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from .conftest import ROOT


def test_wheel_contains_and_loads_its_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)], check=True, timeout=600)
    wheel = next(tmp_path.glob("termchat-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("termchat/themes/termchat-dark.toml", "termchat/themes/termchat-light.toml", "termchat/themes/high-contrast.toml",
                 "termchat/bench/prompts/code.jsonl", "termchat/ui/widgets/message.tcss", "termchat/ui/screens/chat.tcss",
                 "termchat/detect/topic_probe.json"):
        assert name in names, name
    harness = [n for n in names if n.startswith("termchat/") and any(w in n for w in ("monkey", "standin", "conftest"))]
    assert not harness, harness  # the test harness lives in tests/, not in the shipped package
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import termchat, sys\n"
        f"assert termchat.__file__.startswith({str(site)!r}), termchat.__file__\n"
        "from termchat.ui.themes import load_all\n"
        "from termchat.bench.prompt_sets import builtin\n"
        "themes, problems = load_all()\n"
        "assert {'termchat-dark', 'termchat-light', 'high-contrast'} <= set(themes), themes\n"
        "assert all(t.source.startswith(" + repr(str(site)) + ") for t in themes.values()), [t.source for t in themes.values()]\n"
        "assert len(builtin()) >= 60\n"
        "from termchat.detect import topic_probe\n"
        "assert topic_probe.WEIGHTS.is_relative_to(" + repr(str(site)) + ") and len(topic_probe.load_probe().weights) == 576\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "TERMCHAT_HOME": str(tmp_path / "home")}, capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr
