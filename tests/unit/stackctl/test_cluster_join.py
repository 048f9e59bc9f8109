"""Several nodes at start (issue 25 item 3): the head's and a joining node's `ray start` from the profile's
fixed ports and the plan, each node's preflight over its own replicas, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from planner.plan import build_plan
from planner.profile import Profile, load_profile
from stackctl.cluster import gcs_address, join_command, node_plan, ray_port_flags, split_refusal
from stackctl.launcher import StackLayout, head_start_command, stack_env
from stackctl.preflight import start_steps

ROOT = Path(__file__).resolve().parents[3]
TWO = ROOT / "configs" / "cpu-two-nodes.yaml"
SPLIT = ROOT / "configs" / "cpu-two-nodes-split.yaml"


def _flags(command: list[str]) -> dict[str, str]:
    return dict(part.split("=", 1) for part in command if part.startswith("--") and "=" in part)


def test_the_head_starts_on_its_address_with_its_fixed_ports_and_resource(tmp_path):
    profile = load_profile(TWO)
    plan = build_plan(profile)
    flags = _flags(head_start_command("ray", plan, profile, StackLayout(tmp_path)))
    head = profile.pools[0]
    assert flags["--node-ip-address"] == head.address == "127.0.0.3"
    assert flags["--port"] == str(head.ray_ports.gcs) and flags["--node-manager-port"] == str(
        head.ray_ports.node_manager
    )
    assert flags["--min-worker-port"] == str(head.ray_ports.min_worker)
    assert flags["--resources"] == '{"poolserve_node_node-a": 1.0}'
    assert flags["--dashboard-host"] == "127.0.0.1"  # the dashboard never faces the link
    assert gcs_address(profile) == f"127.0.0.3:{head.ray_ports.gcs}"


def test_a_joining_node_asks_for_no_head_port_and_advertises_its_own_resource():
    profile = load_profile(TWO)
    plan = build_plan(profile)
    command = join_command("ray", plan, profile.pools[1], "127.0.0.1:6379")
    flags = _flags(command)
    assert "--head" not in command and "--port" not in flags and "--dashboard-port" not in flags
    assert flags["--address"] == "127.0.0.1:6379" and flags["--node-ip-address"] == "127.0.0.2"
    assert flags["--resources"] == '{"poolserve_node_node-b": 1.0}'
    assert flags["--node-manager-port"] == "52469" and flags["--max-worker-port"] == "52799"  # no port given: the first
    assert flags["--num-cpus"] == "1"
    assert len(ray_port_flags(profile.pools[1], head=False)) == 8


def test_each_node_preflights_only_its_own_replicas():
    plan = build_plan(load_profile(TWO))
    assert [name for name, _, _ in start_steps(node_plan(plan, "node-a"))] == ["embedder", "retriever", "gateway"]
    b = node_plan(plan, "node-b")
    assert [name for name, _, _ in start_steps(b)] == ["chat"] and b.pool.name == "node-b"
    with pytest.raises(ValueError, match="node-c"):
        node_plan(plan, "node-c")


def test_a_cluster_node_lets_nodes_join_and_one_node_does_not(tmp_path):
    layout = StackLayout(tmp_path)
    assert stack_env(layout, {}, cluster=True)["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    assert stack_env(layout, {})["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_two_nodes_on_one_address_with_the_same_ports_are_refused():
    data = yaml.safe_load(TWO.read_text())
    data["pools"][1]["address"] = "127.0.0.3"
    data["pools"][1].pop("ray_ports")
    with pytest.raises(ValidationError, match="share address 127.0.0.3"):
        Profile.model_validate(data)
    data["pools"][1]["address"] = "127.0.0.2"  # another address: the same port numbers are fine
    Profile.model_validate(data)


def test_a_node_on_127_0_0_1_is_refused_since_ray_swaps_it_for_the_machines_address():
    data = yaml.safe_load(TWO.read_text())
    data["pools"][0]["address"] = "127.0.0.1"
    with pytest.raises(ValidationError, match="resolve_ip_for_localhost"):
        Profile.model_validate(data)


def test_a_node_named_twice_is_refused():
    data = yaml.safe_load(TWO.read_text())
    data["pools"][1]["name"] = "node-a"
    with pytest.raises(ValidationError, match="name a node twice"):
        Profile.model_validate(data)


def test_up_starts_a_cpu_split_and_refuses_a_gpu_split_saying_why(tmp_path):
    assert split_refusal(load_profile(TWO)) is None and split_refusal(load_profile(SPLIT)) is None
    data = yaml.safe_load(SPLIT.read_text())
    for pool in data["pools"]:
        pool.update(gpu=True, unified=True)
    for section in ("chat", "embedder"):
        data[section]["model"] = str(ROOT / data[section]["model"])
    path = tmp_path / "gpu-split.yaml"
    path.write_text(yaml.safe_dump(data))
    message = split_refusal(load_profile(path))
    assert message and "chat" in message and "GPU nodes" in message and "not wired" in message


def test_a_node_joins_on_the_next_raylet_port_of_its_span_each_time():
    from stackctl.cluster import next_node_manager_port

    spec = load_profile(TWO).pools[1]
    first = spec.ray_ports.node_manager
    span = spec.ray_ports.node_manager_span
    ports = [next_node_manager_port(spec, None)]
    for _ in range(span):
        ports.append(next_node_manager_port(spec, ports[-1]))
    assert ports[:span] == list(range(first, first + span)) and ports[span] == first  # wraps around
    assert next_node_manager_port(spec, 1234) == first  # a port outside the span (the profile changed)
    command = join_command("ray", build_plan(load_profile(TWO)), spec, "127.0.0.3:6379", first + 2)
    assert _flags(command)["--node-manager-port"] == str(first + 2)
    assert sum(part.startswith("--node-manager-port") for part in command) == 1
