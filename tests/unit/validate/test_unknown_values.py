"""Issue 40 item 2, unknown is unknown: a value kvctl cannot evaluate (a command substitution, a
variable nothing sets, a Python value computed when the code runs) is never a type error or "not
set"; the report says what kvctl could not read, and the verdict rests on what it could. Shell
`${VAR:-default}` / `${VAR:=default}` take their default when the script does not set VAR."""

from __future__ import annotations

from pathlib import Path

from kvctl.validate import validate_path

OFFLOAD = ('{"kv_connector":"OffloadingConnector","kv_role":"kv_both",'
           '"kv_connector_extra_config":{"cpu_bytes_to_use":1000000000}}')


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def messages(report) -> str:  # noqa: ANN001
    return "\n".join(p.message for p in report.problems)


# -- shell ---------------------------------------------------------------------------------
def test_command_substitution_is_set_not_unset(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""#!/bin/bash
P_CONFIG="$(printf '%s' '{OFFLOAD}')"
vllm serve m --kv-transfer-config "$P_CONFIG"
""")
    report = validate_path(path, "0.32.0")
    text = messages(report)
    assert report.ok
    assert "does not set" not in text and "neither kv_connector nor kv_role" not in text
    assert "P_CONFIG" in text and "line 2" in text and "command substitution" in text


def test_command_substitution_leaves_the_rest_of_the_command_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", f"""P_CONFIG=`cat kv.json`
vllm serve m --disable-log-requests --kv-transfer-config "$P_CONFIG"
""")
    report = validate_path(path, "0.32.0")
    assert [p.where.split()[0] for p in report.errors] == [f"{path}:2"]  # the flag 0.17 dropped
    assert "neither kv_connector nor kv_role" not in messages(report)


def test_a_variable_nothing_sets_is_not_a_missing_connector(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", 'vllm serve m --kv-transfer-config "$KV_CONFIG"\n')
    report = validate_path(path, "0.32.0")
    assert report.ok and "neither kv_connector nor kv_role" not in messages(report)
    assert "$KV_CONFIG" in messages(report)


def test_defaults_are_taken_when_the_script_does_not_set_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", """#!/bin/bash
SPEC=${SPEC:-TieringOffloadingSpec}
vllm serve m --kv-transfer-config "{\\"kv_connector\\":\\"OffloadingConnector\\",\\"kv_role\\":\\"kv_both\\",\\"kv_connector_extra_config\\":{\\"spec_name\\":\\"$SPEC\\",\\"cpu_bytes_to_use\\":1000000000}}"
""")
    report = validate_path(path, "0.21.0")  # TieringOffloadingSpec is registered from 0.22
    assert not report.ok and "Unsupported spec type: TieringOffloadingSpec" in messages(report)
    assert validate_path(path, "0.22.0").ok


def test_assigning_default_sets_the_variable_for_later_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", """: ${ROLE:=kv_bth}
: "${CONNECTOR:=MooncakeStoreConnector}"
vllm serve m --kv-transfer-config "{\\"kv_connector\\":\\"$CONNECTOR\\",\\"kv_role\\":\\"$ROLE\\"}"
""")
    report = validate_path(path, "0.32.0")
    assert [p.where.split()[1] for p in report.errors] == ["kv_transfer_config.kv_role"]
    assert "'kv_bth'" in report.errors[0].message


def test_a_default_yields_to_a_value_the_script_sets(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", """ROLE=kv_both
ROLE=${ROLE:-kv_bth}
EMPTY=
vllm serve m --kv-transfer-config "{\\"kv_connector\\":\\"${NAME-MooncakeStoreConnector}\\",\\"kv_role\\":\\"${EMPTY:-$ROLE}\\"}"
""")
    report = validate_path(path, "0.32.0")
    assert report.ok, messages(report)


def test_inline_default_in_the_flag_value(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh",
                 'vllm serve m --kv-transfer-config "${KV_CONFIG:-{\\"kv_connector\\":\\"Nope\\",\\"kv_role\\":\\"kv_both\\"}}"\n')
    report = validate_path(path, "0.32.0")
    assert "Unsupported connector type: Nope" in messages(report)


def test_unknown_values_are_said(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", 'vllm serve m --kv-transfer-config '
                 '"{\\"kv_connector\\":\\"MooncakeStoreConnector\\",\\"kv_role\\":\\"kv_both\\",\\"kv_port\\":\\"$PORT\\"}"\n')
    report = validate_path(path, "0.32.0")
    assert report.ok
    assert any("kv_transfer_config.kv_port" in u and "$PORT" in u for u in report.unread), report.unread
    assert "unread" in report.to_dict()


# -- Python --------------------------------------------------------------------------------
TIERED = """import os
from vllm import LLM
from vllm.config import KVTransferConfig
KVROOT = {root}
TIERS = [{{"type": "fs", "root_dir": KVROOT}}]
ktc = KVTransferConfig(
    kv_connector="OffloadingConnector",
    kv_role="kv_both",
    kv_connector_extra_config={{
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 1000000000,
        "secondary_tiers": {tiers},
    }},
)
llm = LLM(model="x", kv_transfer_config=ktc)
"""


def test_a_computed_python_value_is_not_a_type_error(tmp_path: Path) -> None:
    for root in ('os.environ.get("KVROOT", "/tmp/kv")', '"/mnt/kv"', 'os.path.join("/mnt", "kv")'):
        for tiers in ('[{"type": "fs", "root_dir": KVROOT}]', "TIERS"):
            path = write(tmp_path, "tiered.py", TIERED.format(root=root, tiers=tiers))
            report = validate_path(path, "0.23.0")
            assert report.ok, (root, tiers, messages(report))


def test_a_module_literal_is_read_through_its_name(tmp_path: Path) -> None:
    path = write(tmp_path, "tiered.py", TIERED.format(root='"/mnt/kv"', tiers="TIERS").replace(
        'TIERS = [{"type": "fs"', 'TIERS = [{"type": "fs_python"'))
    report = validate_path(path, "0.23.0")  # fs_python was 0.22's name: 0.23 registers fs
    assert not report.ok and "fs_python" in messages(report)


def test_a_computed_tier_type_or_spec_is_not_judged(tmp_path: Path) -> None:
    text = TIERED.format(root='"/mnt/kv"', tiers='[{"type": os.environ["TIER"], "root_dir": KVROOT}]')
    report = validate_path(write(tmp_path, "tiered.py", text), "0.23.0")
    assert report.ok, messages(report)
    assert any("secondary_tiers[0].type" in u for u in report.unread), report.unread
    extra = text.replace('"spec_name": "TieringOffloadingSpec"', '"spec_name": pick_spec()')
    report = validate_path(write(tmp_path, "tiered.py", extra), "0.23.0")
    assert report.ok, messages(report)


def test_an_extra_config_held_in_a_name(tmp_path: Path) -> None:
    path = write(tmp_path, "x.py", """from vllm.config import KVTransferConfig
EXTRA = {"cpu_bytes_to_use": "ten gigabytes"}
ktc = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=EXTRA)
""")
    report = validate_path(path, "0.32.0")
    assert not report.ok and "ten gigabytes" in messages(report)


def test_an_unquoted_heredoc_is_read_with_the_variables_bash_fills_in(tmp_path: Path) -> None:
    """`cat > f <<JSON` expands ${...} (with their defaults) as bash does; `<<'JSON'` does not."""
    text = """SIZE="${SIZE:-1073741824}"
cat > /tmp/mooncake.json <<JSON
{"metadata_server": "P2PHANDSHAKE", "master_server_address": "127.0.0.1:50051", "protocol": "tcp",
 "device_name": "", "global_segment_size": ${SIZE}, "local_buffer_size": ${SIZE}, "enable_offload": false}
JSON
"""
    report = validate_path(write(tmp_path, "run.sh", text), "0.21.0")
    assert any(p.where.endswith("mooncake.enable_offload") and p.dropped for p in report.errors), \
        [p.message for p in report.problems]
    quoted = text.replace("<<JSON", "<<'JSON'")
    report = validate_path(write(tmp_path, "run.sh", quoted + "vllm serve m --kv-transfer-config '{}'\n"), "0.21.0")
    assert not any("enable_offload" in p.where for p in report.problems)  # no JSON bash would write
