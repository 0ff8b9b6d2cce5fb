"""What TLS and bearer tokens cost per call: the real `python -m service`, five setups side by side.

    python -m bench.security_overhead [--model-dir models/all-minilm-l6-v2] [--calls 2000] [--connections 100]

Setups: plaintext, plaintext + token, TLS, TLS + token, mTLS + token (certificates from
deploy/scripts/make-dev-certs.sh in a temporary folder). Per setup, one blocking client makes
`--calls` sequential ListModels calls on one connection (per-call cost: the interceptor, record
encryption), then `--connections` calls each on a fresh connection (the handshake). Reported per
call: client wall-clock and the server's CPU time (user + system from /proc), in microseconds.
ListModels does no model work, so the differences are the security layers' own cost.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, ServiceProcess, conditions
from client.channel import Credentials, open_channel
from service.proto import inference_pb2 as pb
from service.proto.inference_pb2_grpc import ModelServiceStub

TOKEN = "bench-token-0123456789abcdef"


def server_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, clock ticks (USER_HZ = 100)


def timed(pid: int, calls: int, call) -> dict:
    cpu, start = server_cpu_seconds(pid), time.perf_counter()
    for _ in range(calls):
        call()
    wall = time.perf_counter() - start
    return {
        "wall_us": round(wall / calls * 1e6, 1),
        "server_cpu_us": round((server_cpu_seconds(pid) - cpu) / calls * 1e6, 1),
    }


def measure(models: Path, flags: list[str], creds: Credentials, calls: int, connections: int) -> dict:
    service = ServiceProcess(models, flags)
    try:
        pid, request = service.proc.pid, pb.ListModelsRequest()
        with open_channel(service.address, creds) as channel:
            stub = ModelServiceStub(channel)
            for _ in range(200):  # warm-up
                stub.ListModels(request, timeout=10)
            one = timed(pid, calls, lambda: stub.ListModels(request, timeout=10))

        def fresh() -> None:
            with open_channel(service.address, creds, [("grpc.use_local_subchannel_pool", 1)]) as ch:
                ModelServiceStub(ch).ListModels(request, timeout=10)

        return {"one_connection": one, "fresh_connections": timed(pid, connections, fresh)}
    finally:
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "all-minilm-l6-v2")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "models").mkdir()
        (tmp / "models" / args.model_dir.name).symlink_to(args.model_dir.resolve(), target_is_directory=True)
        subprocess.run([str(ROOT / "deploy/scripts/make-dev-certs.sh"), str(tmp / "certs")], check=True)
        c = tmp / "certs"
        (tmp / "tokens").write_text(TOKEN + "\n")
        tls = ["--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server.key")]
        tokens = ["--auth-tokens-file", str(tmp / "tokens")]
        setups = {
            "plaintext": ([], Credentials()),
            "plaintext+token": (tokens, Credentials(token=TOKEN)),
            "tls": (tls, Credentials(tls_ca=str(c / "ca.pem"))),
            "tls+token": (tls + tokens, Credentials(token=TOKEN, tls_ca=str(c / "ca.pem"))),
            "mtls+token": (
                tls + tokens + ["--tls-client-ca", str(c / "ca.pem")],
                Credentials(TOKEN, str(c / "ca.pem"), str(c / "client.pem"), str(c / "client.key")),
            ),
        }
        results = {
            name: measure(tmp / "models", flags, creds, args.calls, args.connections)
            for name, (flags, creds) in setups.items()
        }
    sys.stdout.write(
        json.dumps(
            {"conditions": conditions(), "calls": args.calls, "connections": args.connections, "results": results},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
