"""Render nginx.conf.template into a runnable nginx prefix folder.

python deploy/nginx/render.py --prefix /tmp/ngx --listen 127.0.0.1:9080 --upstream 127.0.0.1:50051
nginx -p /tmp/ngx -e /tmp/ngx/error.log -c /tmp/ngx/nginx.conf -g 'daemon off;'
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from string import Template

TEMPLATE = Path(__file__).with_name("nginx.conf.template")


def render(prefix: str | os.PathLike, listen: str, upstreams: list[str], workers: int = 1) -> Path:
    prefix = Path(prefix).resolve()
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    text = Template(TEMPLATE.read_text()).substitute(
        PREFIX=str(prefix),
        LISTEN=listen,
        WORKERS=str(workers),
        UPSTREAMS="\n        ".join(f"server {u};" for u in upstreams),
    )
    out = prefix / "nginx.conf"
    out.write_text(text)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", required=True)
    p.add_argument("--listen", default="127.0.0.1:9080")
    p.add_argument("--upstream", default="127.0.0.1:50051", help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    print(render(a.prefix, a.listen, a.upstream.split(","), a.workers))


if __name__ == "__main__":
    main()
