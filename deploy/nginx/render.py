#!/usr/bin/env python3
"""Writes nginx.conf.template with its @NAME@ markers replaced (to stdout or --out).

  render.py --http-listen 8000 --grpc-listen 8001 \\
      --http-server 10.0.0.11:8000 --grpc-server 10.0.0.11:8001 [...]

Each --http-server / --grpc-server is one replica's address; --max-fails and
--fail-timeout set nginx's passive health check for every one of them.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def render(http_listen, grpc_listen, http_servers, grpc_servers, max_fails=2,
           fail_timeout="5s", template=os.path.join(HERE, "nginx.conf.template")):
    with open(template) as f:
        text = f.read()

    def servers(addresses):
        return "\n".join(f"    server {a} max_fails={max_fails} fail_timeout={fail_timeout};"
                         for a in addresses)

    for marker, value in (("@HTTP_SERVERS@", servers(http_servers)),
                          ("@GRPC_SERVERS@", servers(grpc_servers)),
                          ("@HTTP_LISTEN@", str(http_listen)),
                          ("@GRPC_LISTEN@", str(grpc_listen))):
        if marker not in text:
            raise ValueError(f"{template} has no {marker}")
        text = text.replace(marker, value)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-listen", required=True, help="address:port or port")
    p.add_argument("--grpc-listen", required=True, help="address:port or port")
    p.add_argument("--http-server", action="append", required=True)
    p.add_argument("--grpc-server", action="append", required=True)
    p.add_argument("--max-fails", type=int, default=2)
    p.add_argument("--fail-timeout", default="5s")
    p.add_argument("--out")
    a = p.parse_args()
    text = render(a.http_listen, a.grpc_listen, a.http_server, a.grpc_server, a.max_fails,
                  a.fail_timeout)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
