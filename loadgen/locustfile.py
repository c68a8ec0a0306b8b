"""The locustfile ``pathprobe load`` runs: one user class that talks to ``--host``.

Usable directly too: ``locust -f <this file> -H grpc://127.0.0.1:50051``.
"""

from pathprobe.loadgen.users import LLMUser

__all__ = ["LLMUser"]
