"""Structural checks for docker-compose.temporal.yml.

Docker cannot run on the development machines, so these tests only parse the file with
PyYAML and check its shape. If a Docker Compose client is installed, the file is also
validated with ``docker compose config -q``, which needs no daemon.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.temporal.yml"

SERVICES = ("postgresql", "temporal", "temporal-ui", "exactcall-worker")
PASSWORD_VARS = ("POSTGRES_PASSWORD", "POSTGRES_PWD")
SECRET_NAME = re.compile(r"PASSWORD|PWD|SECRET|TOKEN|API_KEY", re.IGNORECASE)
# A compose interpolation with a default, and nothing else: ${NAME:-default}
DEFAULT_INTERPOLATION = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:-[^}]*\}$")
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """Return a service's environment as a dict, whichever syntax it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {p[0]: (p[1] if len(p) > 1 else "") for p in pairs}
    return {key: "" if value is None else str(value) for key, value in env.items()}


def _published_ports(service: dict[str, Any]) -> set[int]:
    """Host ports a service publishes (short ``[ip:]host:container`` or long syntax)."""
    published: set[int] = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            if "published" in port:
                published.add(int(port["published"]))
            continue
        parts = str(port).split("/")[0].split(":")
        if len(parts) >= 2:
            published.add(int(parts[-2]))
    return published


def _depends_condition(service: dict[str, Any], name: str) -> str | None:
    depends = service.get("depends_on") or {}
    assert isinstance(depends, dict), "depends_on must use the long syntax with conditions"
    entry = depends.get(name)
    return None if entry is None else entry.get("condition")


def _command_text(service: dict[str, Any]) -> str:
    command = service.get("command")
    if isinstance(command, list):
        return " ".join(str(part) for part in command)
    return str(command or "")


def test_file_parses(compose: dict[str, Any]) -> None:
    assert "services" in compose
    assert "version" not in compose, "use the compose spec: no top-level version key"


def test_expected_services_exist(services: dict[str, dict[str, Any]]) -> None:
    for name in SERVICES:
        assert name in services, f"missing service {name}"


def test_postgresql_has_pg_isready_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    test = services["postgresql"]["healthcheck"]["test"]
    text = " ".join(test) if isinstance(test, list) else str(test)
    assert "pg_isready" in text


def test_temporal_waits_for_healthy_postgresql(services: dict[str, dict[str, Any]]) -> None:
    temporal = services["temporal"]
    assert _depends_condition(temporal, "postgresql") == "service_healthy"
    assert temporal["healthcheck"]["test"], "temporal needs a healthcheck"
    env = _environment(temporal)
    assert env["DB"] == "postgres12"
    assert env["POSTGRES_SEEDS"] == "postgresql"


def test_worker_waits_for_healthy_temporal(services: dict[str, dict[str, Any]]) -> None:
    worker = services["exactcall-worker"]
    assert _depends_condition(worker, "temporal") == "service_healthy"


def test_worker_runs_exactcall_worker(services: dict[str, dict[str, Any]]) -> None:
    worker = services["exactcall-worker"]
    command = _command_text(worker)
    assert "exactcall worker" in command
    for flag in ("--task-queue", "--tools", "--workflows"):
        assert flag in command
    assert worker["restart"] == "unless-stopped"
    assert worker["stop_signal"] == "SIGTERM"
    env = _environment(worker)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["TEMPORAL_NAMESPACE"] == "default"


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        # The tag follows the last ':' after the last '/' (a registry may carry a port).
        last_segment = image.rsplit("/", 1)[-1]
        assert ":" in last_segment, f"{name}: image {image!r} has no tag"
        tag = last_segment.rsplit(":", 1)[1]
        assert tag, f"{name}: image {image!r} has an empty tag"
        assert tag != "latest", f"{name}: image {image!r} uses latest"


def test_published_ports(services: dict[str, dict[str, Any]]) -> None:
    assert 7233 in _published_ports(services["temporal"])
    assert 8233 in _published_ports(services["temporal-ui"])


def test_no_plaintext_secrets(services: dict[str, dict[str, Any]]) -> None:
    seen_password = False
    for name, service in services.items():
        for key, value in _environment(service).items():
            if key in PASSWORD_VARS:
                seen_password = True
                assert DEFAULT_INTERPOLATION.match(value), (
                    f"{name}.{key} must be a ${{VAR:-default}} interpolation, got {value!r}"
                )
            elif SECRET_NAME.search(key):
                assert value == "" or INTERPOLATION.fullmatch(value), (
                    f"{name}.{key} looks like a plaintext secret"
                )
    assert seen_password, "expected POSTGRES_PASSWORD / POSTGRES_PWD in the file"


def test_postgresql_volume_is_declared(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = compose.get("volumes") or {}
    used = [
        str(volume).split(":", 1)[0]
        for volume in services["postgresql"].get("volumes") or []
        if not isinstance(volume, dict)
    ]
    named = [v for v in used if not v.startswith((".", "/", "~"))]
    assert named, "postgresql must keep its data in a named volume"
    for volume in named:
        assert volume in declared, f"volume {volume} is not declared at top level"


def test_default_tools_module_exists(services: dict[str, dict[str, Any]]) -> None:
    value = _environment(services["exactcall-worker"])["EXACTCALL_TOOLS"]
    match = INTERPOLATION.fullmatch(value)
    assert match and match.group(2), f"EXACTCALL_TOOLS should have a default, got {value!r}"
    module = match.group(2)
    assert module == "exactcall.demo.tools"
    path = REPO_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    assert path.is_file(), f"default tools module {module} not found at {path}"
