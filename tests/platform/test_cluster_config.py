"""cluster.yaml passes Ray's own cluster-config validation and keeps the platform's invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config


def load(repo: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((repo / "cluster.yaml").read_text())
    return config


def test_ray_validates_cluster_yaml(repo: Path) -> None:
    # What `ray up` does before launching anything: fill in the provider's defaults, then check
    # the result against Ray's JSON schema (raises with the schema error on a bad file).
    prepared = prepare_config(load(repo))
    validate_config(prepared)
    assert prepared["head_node_type"] == "head"


def test_every_node_type_names_its_node_group(repo: Path) -> None:
    types = load(repo)["available_node_types"]
    for name, node_type in types.items():
        assert "switchyard/node-group" in node_type["labels"], name
    gpu_types = {n: t for n, t in types.items() if t["resources"].get("GPU", 0) > 0}
    assert {t["labels"]["switchyard/pool"] for t in gpu_types.values()} == {"training", "inference"}
    # A training node must hold a whole 8-GPU gang.
    assert all(t["resources"]["GPU"] == 8 for t in gpu_types.values() if t["labels"]["switchyard/pool"] == "training")


def test_token_auth_stays_on_and_nothing_runs_ray_stop(repo: Path) -> None:
    config = load(repo)
    commands = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert commands.count("RAY_AUTH_MODE=token") >= 2
    assert "ray stop" not in commands
    assert "~/.ray/auth_token" in config["file_mounts"]


def test_a_broken_cluster_yaml_is_rejected(repo: Path) -> None:
    import jsonschema
    import pytest

    config = load(repo)
    config["available_node_types"]["train-a100"]["resources"]["GPU"] = "eight"
    with pytest.raises(jsonschema.ValidationError, match="eight"):
        validate_config(prepare_config(config))


def test_kuberay_manifests_match_cluster_yaml(repo: Path) -> None:
    cluster = yaml.safe_load((repo / "deploy/kuberay/raycluster.yaml").read_text())
    service = yaml.safe_load((repo / "deploy/kuberay/rayservice.yaml").read_text())
    assert cluster["kind"] == "RayCluster" and service["kind"] == "RayService"
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    launcher_types = load(repo)["available_node_types"]
    assert set(groups) == set(launcher_types) - {"head"}
    for name, group in groups.items():
        gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) == launcher_types[name]["resources"]["GPU"]
        assert f"switchyard/node-group={name}" in group["rayStartParams"]["labels"]
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    assert app["import_path"] == "serve_apps.gateway:build_app" and set(app["args"]) == {"policies_dir", "state_dir"}


def test_every_node_gets_the_shared_database_url(repo: Path) -> None:
    # A replica on a node without the URL would open its own SQLite state; it refuses to start,
    # but the configs must not make that the normal case.
    config = load(repo)
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command or "switchyard up" in command:
            assert "SWITCHYARD_DATABASE_URL=$(cat ~/.switchyard-database-url)" in command, command
    assert "~/.switchyard-database-url" in config["file_mounts"]
    for manifest in ("raycluster.yaml", "rayservice.yaml"):
        text = (repo / "deploy" / "kuberay" / manifest).read_text()
        containers = text.count("image: switchyard:latest")
        # raycluster.yaml shares one env block (a YAML anchor) among its three containers.
        assert text.count("name: SWITCHYARD_DATABASE_URL") == (1 if "&platform-env" in text else containers), manifest
        assert "secretKeyRef: {name: switchyard-database, key: url}" in text
    docs = list(yaml.safe_load_all((repo / "deploy" / "kuberay" / "postgres.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"Service", "StatefulSet"}
