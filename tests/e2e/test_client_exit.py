"""Issue 25 #18: a script that never closes its blocking ``Client`` exits quietly.

Without the exit hook, the interpreter destroyed the client's loop under an open Kafka
producer and printed "Unclosed AIOKafkaProducer" and "Task was destroyed but it is
pending!" after the script's own output."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

SCRIPT = textwrap.dedent("""
    import sys
    from batchfleet.producers import Client
    client = Client(sys.argv[1], results=sys.argv[2], check_model=False)
    print(client.submit("demo-mlp", [0.1] * 10))
""")


def test_a_kafka_client_left_open_closes_quietly_at_exit(kafka_broker: str,
                                                          redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"kafka://{kafka_broker}", redis_url],
                          check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 1  # the request ID, and nothing else
    assert "Unclosed" not in done.stderr and "Task was destroyed" not in done.stderr, \
        done.stderr
