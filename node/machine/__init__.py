"""The machine a node runs on: what it can offer, whether its volunteer is using it,
the service that starts the node on it, and what stands between it and useful work.

Each module reads the machine (NVML or torch, `/dev/input` and the terminals, `/proc`,
systemd, the data dir), or is a plain function of what was read, and holds no node
state: the daemon, the node's state and the command line call it. Nothing here imports
the rest of the node, and nothing imports torch before it is asked a question only
torch can answer. The face re-exports what the rest of the node uses, except the
service's verbs (`install`, `uninstall`, `state`), which are imported from
`service_unit`, where their names read with the module's.

- `capacity`: devices, the measured TFLOP/s, the determinism class; `capacity.json`.
- `idle`: how long since the volunteer last used the machine (`idle_minutes`), and the
  load of everything but our own training.
- `sensors`: what the machine guards read: temperatures, the power supply, memory,
  running programs.
- `service_unit`: the node as a systemd user service: the unit file, installing it,
  asking systemd about it.
- `doctor`: what stands between this node and useful work, each with its fix: plain
  functions from facts (the node's status and peers, the data dir, torch) to findings.
"""

from __future__ import annotations

from node.machine.capacity import (
    CACHE_FILE,
    LocalCapacity,
    determinism_class,
    local_capacity,
    machine_fingerprint,
    measure_elsewhere,
    measure_tflops,
    measured_capacity,
)
from node.machine.doctor import (
    MAX_SKEW_S,
    OK,
    PROBLEM,
    WARN,
    Finding,
    data_dir_findings,
    node_findings,
    torch_findings,
    worst,
)
from node.machine.idle import IdleSensor, InputWatch, OtherLoad, process_cpu_s
from node.machine.sensors import Readings, Sensors
from node.machine.service_unit import UNIT_NAME, ServiceError, unit_path, unit_text

__all__ = [
    "CACHE_FILE",
    "MAX_SKEW_S",
    "OK",
    "PROBLEM",
    "UNIT_NAME",
    "WARN",
    "Finding",
    "IdleSensor",
    "InputWatch",
    "LocalCapacity",
    "OtherLoad",
    "Readings",
    "Sensors",
    "ServiceError",
    "data_dir_findings",
    "determinism_class",
    "local_capacity",
    "measure_elsewhere",
    "measured_capacity",
    "machine_fingerprint",
    "measure_tflops",
    "node_findings",
    "process_cpu_s",
    "torch_findings",
    "unit_path",
    "unit_text",
    "worst",
]
