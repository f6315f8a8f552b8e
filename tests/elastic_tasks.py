"""Runner requests of the elastic tasks (`training.run.runner`), run in the test's own
process as a worker's or an owner's node would have its runner run them."""

from __future__ import annotations

import shutil
from pathlib import Path

from training.run.runner import run_request


def run_task(
    root: Path,
    spec: dict,
    name: str,
    task: str,
    blobs: dict,
    kept: Path | None = None,
    checkpoints: bool = False,
    **elastic: object,
) -> dict:
    """One runner request in its own folder, `root / name`, run in this process; `kept`
    is the inner state a worker kept, copied in beside the request's output as the
    worker does. Paths of `*_out` keys are names in that folder."""
    folder = root / name
    folder.mkdir(
        parents=True, exist_ok=True
    )  # a share's notice of its round's weights may be there
    if kept is not None:
        shutil.copyfile(kept, folder / "state_in.safetensors")
        elastic["state_in"] = str(folder / "state_in.safetensors")
    request = {
        "spec": spec,
        "blobs": {sha: str(path) for sha, path in blobs.items()},
        "out": str(folder / "out.bin"),
        "device": "cpu",
        "task": task,
    }
    if checkpoints:
        request["checkpoints"] = True
    if elastic:
        request["elastic"] = {
            k: str(folder / v) if k.endswith("_out") else v for k, v in elastic.items() if v != ""
        }
    result = run_request(request, lambda event: None)
    result["folder"] = folder
    return result
