"""`tablekeeper server` settings from flags, the environment and a TOML file: precedence, every
kind of value from every source, `--print-config`, the workers' command line, and the errors
(one line naming the file and key, or the variable)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from tablekeeper.cli import main as cli_main
from tablekeeper_server.config import (
    CONFIG_ENV_VAR,
    SERVER_SETTINGS,
    ServerConfig,
    add_server_arguments,
    config_from_settings,
    effective_values,
    printed_config,
    resolve_runtime,
    resolve_settings,
    worker_command,
)
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.security.config import SecurityConfig
from tablekeeper_server.settings import (
    SettingError,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)

pytestmark = pytest.mark.unit

ENV = "TABLEKEEPER_SERVER_"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tablekeeper server")
    add_server_arguments(parser)
    return parser


def _config(
    argv: list[str] | None = None,
    environ: dict[str, str] | None = None,
    file_text: str | None = None,
    tmp_path: Path | None = None,
) -> ServerConfig:
    argv = list(argv or [])
    if file_text is not None:
        assert tmp_path is not None
        path = tmp_path / "tk.toml"
        path.write_text(file_text)
        argv = ["--config", str(path), *argv]
    resolved = resolve_settings(_parser().parse_args(argv), environ or {})
    return config_from_settings(resolved)


def _error(
    tmp_path: Path, file_text: str | None = None, environ: dict[str, str] | None = None
) -> str:
    with pytest.raises(SettingError) as caught:
        _config(environ=environ, file_text=file_text, tmp_path=tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------- precedence


def test_defaults_are_the_dataclass_defaults_but_the_runtime() -> None:
    # `--runtime auto`, the setting's default, is resolved where the settings are read; a
    # configuration made in code runs in-process (grpc-aio).
    runtime = resolve_runtime()
    expected = dataclasses.replace(
        ServerConfig(), runtime=runtime, runtime_fell_back=runtime != "envoy"
    )
    assert _config() == expected


def test_runtime_auto_is_envoy_when_pyvoy_is_installed() -> None:
    # (Without pyvoy: grpc-aio and the warning, in a real server-only environment,
    # tests/integration/test_packaging.py.)
    installed = importlib.util.find_spec("pyvoy") is not None
    config = _config()
    assert config.runtime == ("envoy" if installed else "grpc-aio")
    assert config.runtime_fell_back is not installed
    assert _config(argv=["--runtime", "grpc-aio"]).runtime == "grpc-aio"
    assert not _config(argv=["--runtime", "grpc-aio"]).runtime_fell_back
    assert _config(argv=["--runtime", "envoy"]).runtime == "envoy"


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    text = "port = 1111\nmetrics-port = 2222\netcd-port = 3333\n"
    environ = {f"{ENV}PORT": "4444", f"{ENV}METRICS_PORT": "5555"}
    config = _config(["--port", "6666"], environ, text, tmp_path)
    assert config.port == 6666  # flag over env over file
    assert config.metrics_port == 5555  # env over file
    assert config.etcd_port == 3333  # file over default
    assert config.oxia_port == ServerConfig().oxia_port  # default


def test_the_file_can_come_from_the_environment(tmp_path: Path) -> None:
    named_by_env = tmp_path / "env.toml"
    named_by_env.write_text("containers = 5\n")
    given = tmp_path / "flag.toml"
    given.write_text("containers = 7\n")
    environ = {CONFIG_ENV_VAR: str(named_by_env)}
    assert config_from_settings(resolve_settings(_parser().parse_args([]), environ)).containers == 5
    args = _parser().parse_args(["--config", str(given)])
    assert config_from_settings(resolve_settings(args, environ)).containers == 7


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    config = _config(environ={f"{ENV}PORT": "", f"{ENV}ZK": " "}, file_text="port = 1234\n",
                     tmp_path=tmp_path)  # fmt: skip
    assert config.port == 1234 and config.zk_hosts is None


def test_a_switch_set_by_the_environment_is_turned_off_by_its_no_flag(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("x")
    key.write_text("x")
    environ = {f"{ENV}TLS_CERT": str(cert), f"{ENV}TLS_KEY": str(key), f"{ENV}METRICS_TLS": "1"}
    assert _config(environ=environ).security.metrics_tls is True
    assert _config(["--no-metrics-tls"], environ).security.metrics_tls is False


def test_the_client_clis_tls_variables_do_not_leak_into_the_servers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The client's global --tls-ca/--tls-cert/--tls-key (TABLEKEEPER_TLS_*) share the parsed
    namespace with `server`'s flags of the same names; the server must not read them."""
    for name in ("TABLEKEEPER_TLS_CA", "TABLEKEEPER_TLS_CERT", "TABLEKEEPER_TLS_KEY"):
        monkeypatch.setenv(name, "/no/such/client.pem")
    assert cli_main(["server", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "# tls-cert is unset" in printed and "# tls-ca is unset" in printed


# ------------------------------------------------------------------------- kinds of values


def test_every_kind_from_the_file(tmp_path: Path) -> None:
    text = """
data-dir = "/var/lib/tk"            # path
checkpoint-interval = "5m"          # duration, with a unit
pulsar-timeout = 12.5               # duration, in seconds
wal-segment-bytes = "8MiB"          # size, with a unit
containers = 3                      # integer
log-level = "debug"                 # choice, normalised
zk = "127.0.0.1:2181"               # optional string
log = "pulsar"
checkpoint-store = "pulsar"

[limits]
max-key-bytes = 1024                # size, in bytes
max-txn-ops = 7

[security]
superuser-roles = ["admin", "ops"]  # list
metrics-tls = false                 # switch
"""
    config = _config(file_text=text, tmp_path=tmp_path)
    assert config.data_dir == Path("/var/lib/tk")
    assert config.checkpoint_interval_s == 300.0
    assert config.pulsar_timeout_s == 12.5
    assert config.wal_segment_bytes_max == 8 << 20
    assert config.containers == 3
    assert config.log_level == "DEBUG"
    assert config.zk_hosts == "127.0.0.1:2181"
    assert config.limits == Limits(key_bytes_max=1024, txn_ops_max=7)
    assert config.security == SecurityConfig(superuser_roles=("admin", "ops"))


def test_every_kind_from_the_environment() -> None:
    environ = {
        f"{ENV}DATA_DIR": "/var/lib/tk",
        f"{ENV}CHECKPOINT_INTERVAL": "250ms",
        f"{ENV}WAL_SEGMENT_BYTES": "1GiB",
        f"{ENV}CONTAINERS": "3",
        f"{ENV}LOG_LEVEL": "warning",
        f"{ENV}ADVERTISE_HOST": "tk.example",
        f"{ENV}MAX_VALUE_BYTES": "10MB",
        f"{ENV}SUPERUSER_ROLES": "admin, ops",
    }
    config = _config(environ=environ)
    assert config.data_dir == Path("/var/lib/tk")
    assert config.checkpoint_interval_s == 0.25
    assert config.wal_segment_bytes_max == 1 << 30
    assert config.containers == 3
    assert config.log_level == "WARNING"
    assert config.advertised_host == "tk.example"
    assert config.limits.value_bytes_max == 10_000_000
    assert config.security.superuser_roles == ("admin", "ops")


def test_flags_take_the_same_units() -> None:
    config = _config(["--checkpoint-interval", "1h", "--max-value-bytes", "512KiB"])
    assert config.checkpoint_interval_s == 3600 and config.limits.value_bytes_max == 512 << 10
    assert _config(["--checkpoint-interval", "300"]).checkpoint_interval_s == 300  # seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("64MiB", 64 << 20),
        ("64 mib", 64 << 20),
        ("1.5KiB", 1536),
        ("2GB", 2 * 10**9),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize("text", ["", "MiB", "-1", "1.3B", "5 parsecs", "1e3"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="size|bytes"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [("300", 300, "5m"), ("90s", 90, "90s"), ("250ms", 0.25, "250ms"), ("1.5s", 1.5, "1500ms"),
     ("2h", 7200, "2h"), ("7d", 604800, "7d"), ("0", 0, "0s"), ("0.1234567s", 0.1234567, None)],
)  # fmt: skip
def test_durations(text: str, seconds: float, shown: str | None) -> None:
    assert parse_duration(text) == seconds
    if shown is not None:
        assert format_duration(seconds) == shown
    assert parse_duration(format_duration(seconds)) == seconds


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('data_dir = "x"\n', "tk.toml: data_dir: no such setting (did you mean data-dir?)"),
        ("chekpoint-interval = 1\n", "(did you mean checkpoint-interval?)"),
        ("max-key-bytes = 10\n", "max-key-bytes: no such setting here (it belongs under [limits])"),
        ("[limits]\nport = 1\n", "limits.port: no such setting here (it belongs at the top level)"),
        ("[network]\nport = 1\n", "tk.toml: network: no such setting"),
        ("limits = 3\n", "tk.toml: limits: expected a table ([limits])"),
        ('port = "4181"\n', "tk.toml: port: expected an integer, got a string ('4181')"),
        ("containers = true\n", "containers: expected an integer, got a boolean"),
        ('checkpoint-interval = "5 minutes"\n', "checkpoint-interval: not a duration: '5 minutes'"),
        ("checkpoint-interval = inf\n", "checkpoint-interval: not a duration: inf"),
        ('[limits]\nmax-key-bytes = "1x"\n', "tk.toml: limits.max-key-bytes: not a size: '1x'"),
        ('log = "kafka"\n', "tk.toml: log: invalid choice: 'kafka' (choose from local, pulsar)"),
        ('[security]\nmetrics-tls = "yes"\n', "security.metrics-tls: expected a boolean"),
        ('[security]\nsuperuser-roles = "a,b"\n', "expected an array of strings"),
        ("containers = \n", "tk.toml: not valid TOML: Invalid value (at line 1, column 14)"),
        ("containers = 0\n", "--containers must be at least 1 (--containers from "),
    ],
)
def test_file_errors_name_the_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, file_text=text)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({f"{ENV}PORTT": "1"}, f"{ENV}PORTT: no such setting (did you mean {ENV}PORT?)"),
        ({f"{ENV}PORT": "http"}, f"{ENV}PORT: not an integer: 'http'"),
        ({f"{ENV}METRICS_TLS": "maybe"}, f"{ENV}METRICS_TLS: not a boolean: 'maybe'"),
        ({f"{ENV}LOG_FORMAT": "xml"}, f"{ENV}LOG_FORMAT: invalid choice: 'xml' (choose from"),
        ({f"{ENV}WAL_SEGMENT_BYTES": "1KiB"}, f"(--wal-segment-bytes from env {ENV}WAL_SEGMENT_"),
        ({CONFIG_ENV_VAR: "/no/such/tk.toml"}, "/no/such/tk.toml: cannot read the configuration"),
    ],
)
def test_environment_errors_name_the_variable(
    tmp_path: Path, environ: dict[str, str], expected: str
) -> None:
    assert expected in _error(tmp_path, environ=environ)


def test_the_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tk.toml"
    path.write_text('checkpoint-interval = "soon"\n')
    assert cli_main(["server", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"tablekeeper server: error: {path}: checkpoint-interval: not a duration")


# ------------------------------------------------------------ --print-config and the workers


def test_print_config_reads_back_as_the_same_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tk.toml"
    path.write_text(
        'checkpoint-interval = "90s"\nzk-session-timeout = 0.5\n'
        '[limits]\nmax-value-bytes = 1000\n[security]\nsuperuser-roles = ["a\\"b", "é"]\n'
    )
    argv = ["--config", str(path), "--containers", "12", "--no-metrics-tls"]
    resolved = resolve_settings(_parser().parse_args(argv), {f"{ENV}PORT": "5000"})
    config = config_from_settings(resolved)
    text = printed_config(config, resolved)
    assert "containers = 12  # from command line" in text
    assert f"port = 5000  # from env {ENV}PORT" in text
    assert f'checkpoint-interval = "90s"  # from {path}: checkpoint-interval' in text
    assert "# wal-dir is unset: DATA_DIR/wal" in text
    assert "max-batch-ops = 10000\n" in text  # defaults too, without a comment

    printed = tmp_path / "printed.toml"
    printed.write_text(text)
    assert _config(["--config", str(printed)]) == config

    assert cli_main(["server", "--config", str(printed), "--print-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    values = [line for line in lines if line and not line.startswith(("#", "["))]
    assert len(values) > 30 and all(f"  # from {printed}: " in line for line in values)


def test_workers_get_the_whole_configuration_as_flags_and_no_settings_variables(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    text = f'workers = 2\ncheckpoint-interval = "2m"\n[security]\ntls-cert = "{cert}"\n'
    environ = {f"{ENV}TLS_KEY": str(cert), f"{ENV}CONTAINERS": "6", "HOME": "/home/tk"}
    config = _config(["--max-open-ranges", "50"], environ, text, tmp_path)
    flags, env = worker_command(config, {**environ, CONFIG_ENV_VAR: "tk.toml"})
    assert env == {"HOME": "/home/tk"}
    assert "--checkpoint-interval=2m" in flags and "--workers=2" in flags
    assert "--no-metrics-tls" in flags
    assert not any(flag.startswith("--wal-dir") for flag in flags)  # unset stays unset
    assert _config(flags) == config
    assert effective_values(_config(flags)) == effective_values(config)


def test_every_setting_has_a_flag_a_key_and_a_variable() -> None:
    parser = _parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    for setting in SERVER_SETTINGS.settings:
        assert setting.flag in flags
        assert setting.env_var(ENV) == ENV + setting.key.upper().replace("-", "_")
    assert {s.section for s in SERVER_SETTINGS.settings} == {"", "limits", "security"}


def test_etcd_keyspaces_from_a_flag_the_environment_and_a_file(tmp_path: Path) -> None:
    from_file = _config(file_text='etcd-keyspaces = ["apps=2381"]\n', tmp_path=tmp_path)
    assert from_file.etcd_keyspaces == ("apps=2381",)
    environ = {"TABLEKEEPER_SERVER_ETCD_KEYSPACES": "a=2381,b=2382"}
    assert _config([], environ).etcd_keyspace_ports == {"a": 2381, "b": 2382}
    assert _config(["--etcd-keyspaces", "c=2383"], environ).etcd_keyspaces == ("c=2383",)


def test_local_logs_sync_on_the_event_loop_on_envoy_only() -> None:
    # grpc.aio reads and writes the network on the event loop: a sync there would stall it.
    from tablekeeper_server.main import _syncs_on_loop

    base = ServerConfig()
    assert _syncs_on_loop(dataclasses.replace(base, runtime="envoy"))
    assert not _syncs_on_loop(dataclasses.replace(base, runtime="grpc-aio"))
    assert _syncs_on_loop(dataclasses.replace(base, runtime="grpc-aio", wal_syncs_on_loop=True))
    assert not _syncs_on_loop(dataclasses.replace(base, runtime="envoy", wal_syncs_on_loop=False))


def test_the_advertised_host_follows_the_bind_host_unless_given() -> None:
    assert _config([]).advertised_host == "127.0.0.1"
    assert _config(["--host", "10.1.2.3"]).advertised_host == "10.1.2.3"
    given = _config(["--host", "10.1.2.3", "--advertise-host", "tk.example"])
    assert given.advertised_host == "tk.example"
