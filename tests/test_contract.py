"""The committed stubs are exactly what grpcio-tools generates from the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("llm_pb2.py", "llm_pb2.pyi", "llm_pb2_grpc.py")


def test_stubs_match_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "proto"),
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            "pathprobe/v1/llm.proto",
        ],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "pathprobe" / "v1" / name).read_text()
        committed = (ROOT / "core" / "v1" / name).read_text()
        assert fresh == committed, f"core/v1/{name} drifted from the .proto: run `make stubs`"


def test_reflection_lists_service(synthetic_server) -> None:
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(synthetic_server.grpc_target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = db.get_services()
        assert "pathprobe.v1.LLM" in services
        assert "grpc.health.v1.Health" in services
        fd = db.FindFileContainingSymbol("pathprobe.v1.LLM")
        assert fd.name == "pathprobe/v1/llm.proto"
