"""CI: does ``grpo-magic[vllm]`` resolve, next to the CI pins, to a vLLM release TRL supports? No GPU needed.

``pip install --dry-run --report`` resolves the package's requirements plus the ``vllm`` extra against
requirements-ci.txt's pins (and install.sh's torch) from PyPI's metadata alone (PEP 658: no wheel is
downloaded, not even torch's CUDA builds; about a minute). transformers and huggingface_hub are left to
the declared ranges: vLLM decides them (vLLM 0.31, the newest TRL 1.16 supports, needs transformers <5.18,
while the main CI leg tests 5.24). The report is then read: the vLLM it picked must be inside TRL's own
``vllm`` extra, torch must be the one CI tests. It prints which vLLM, transformers and torch it resolved.

    python scripts/check_vllm_extra.py            # exit 0: resolves; 1: it does not, with the reason
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from importlib.metadata import requires
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: Left to vLLM's requirements and the declared ranges, not pinned to the main CI leg's releases.
LEFT_TO_VLLM = {"transformers", "huggingface-hub"}
TIMEOUT_S = 300


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def ci_pins(root: Path = ROOT) -> dict[str, str]:
    """requirements-ci.txt's exact pins, plus install.sh's torch."""
    pins = {}
    for line in (root / "requirements-ci.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pins[_name(req.name)] = next(iter(req.specifier)).version
    pins["torch"] = re.search(r'"torch==([\d.]+)"', (root / "scripts" / "install.sh").read_text()).group(1)
    return pins


def trl_vllm_range() -> str:
    """The vLLM releases the installed TRL supports: its own ``vllm`` extra."""
    for line in requires("trl") or []:
        req = Requirement(line)
        if _name(req.name) == "vllm" and req.marker is not None and req.marker.evaluate({"extra": "vllm"}):
            return str(req.specifier)
    raise SystemExit("check_vllm_extra: the installed TRL declares no vllm extra; install the TRL CI pins.")


def resolved(report: dict) -> dict[str, str]:
    """name -> version of everything a ``pip install --report`` would install."""
    return {_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report.get("install", [])}


def cuda_builds(report: dict) -> list[str]:
    """The requirements of the resolved vLLM that name a CUDA build (``pkg[cu13]``): what its GPU machine needs."""
    for item in report.get("install", []):
        if _name(item["metadata"]["name"]) == "vllm":
            found = []
            for line in item["metadata"].get("requires_dist") or []:
                req = Requirement(line)
                if (req.marker is None or req.marker.evaluate({"extra": ""})) and any(
                        re.fullmatch(r"cu\d+", extra) for extra in req.extras):
                    found.append(f"{req.name}[{','.join(sorted(req.extras))}]")
            return found
    return []


def judge(versions: dict[str, str], pins: dict[str, str], trl_range: str) -> list[str]:
    """What is wrong with a resolution (empty: nothing)."""
    problems = []
    vllm = versions.get("vllm")
    if vllm is None:
        return ["the resolution installs no vllm"]
    if Version(vllm) not in Requirement(f"vllm{trl_range}").specifier:
        problems.append(f"vllm {vllm} is outside TRL's vllm extra ({trl_range})")
    torch = versions.get("torch", "")
    if Version(torch.split("+")[0] or "0") != Version(pins["torch"]):
        problems.append(f"torch {torch or 'none'} is not the torch CI tests ({pins['torch']})")
    for name, pin in pins.items():
        if (
            name in versions
            and name not in LEFT_TO_VLLM
            and name != "torch"
            and Version(versions[name]) != Version(pin)
        ):
            problems.append(f"{name} {versions[name]} is not CI's pin {pin}")
    return problems


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["vllm"]]
    pins = ci_pins()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items() if n not in LEFT_TO_VLLM))
        report_path = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report_path),
            "-c",
            str(constraints),
            *requirements,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"check_vllm_extra: pip did not resolve grpo-magic[vllm] within {TIMEOUT_S} s.", file=sys.stderr)
            return 1
        if done.returncode != 0:
            why = "\n".join(line for line in done.stderr.splitlines() if "ignored: it is neither" not in line)
            print(
                f"check_vllm_extra: grpo-magic[vllm] does not resolve with the CI pins ({' '.join(requirements)}); "
                "make pyproject.toml's transformers range contain a release the extra's vLLM declares (vLLM 0.31: "
                f">=5.10.4,<5.18), or change the extra. pip says:\n{why[-3000:]}",
                file=sys.stderr,
            )
            return 1
        report = json.loads(report_path.read_text())
        versions = resolved(report)
        cuda = cuda_builds(report)
    problems = judge(versions, pins, trl_vllm_range())
    summary = ", ".join(f"{n} {versions.get(n, '-')}" for n in ("vllm", "transformers", "torch", "trl"))
    if problems:
        print(
            f"check_vllm_extra: grpo-magic[vllm] resolves to {summary}, but " + "; ".join(problems) + ".",
            file=sys.stderr,
        )
        return 1
    print(f"check_vllm_extra: grpo-magic[vllm] resolves to {summary} ({len(versions)} packages, metadata only).")
    if cuda:
        majors = sorted({m for b in cuda for m in re.findall(r"cu(\d+)", b)})
        print(f"check_vllm_extra: that vLLM requires CUDA builds ({', '.join(cuda)}): a GPU machine needs an NVIDIA "
              f"driver for CUDA {' / '.join(majors)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
