"""Does the documented GPU install resolve? `pip install -r requirements-gpu.txt`, resolved for real.

    python scripts/check_gpu_resolve.py [--requirements requirements-gpu.txt] [--pip PIP] [--refresh]

Runs `pip install --dry-run --ignore-installed --report` on the requirement file against the package index
(no package is installed; with a pip that reads PEP 658 metadata, as 26.x does, no wheel is downloaded
either: ~45 s), so transitive caps count too. That is what a check of the project's pins against vLLM's
direct requirements (tests/unit/project/test_requirements.py) cannot see: vLLM 0.33.0 needs mistral_common, which caps
numpy below 2.4 on Python <= 3.12, and `numpy==2.4.6` made the GPU install ResolutionImpossible.

The verdict is cached per (requirement files' bytes, Python version, pip version) under
$TGRPO_CACHE_DIR (else ~/.cache/tgrpo)/gpu-resolve/, so CI pays for it once per change of the pins. Exit
codes: 0 resolves (and the resolved vllm and torch are the pinned ones), 1 does not resolve (the
conflict is printed), 2 the index could not be asked (not cached; says so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def requirement_files(path: Path) -> list[Path]:
    """The file and every file it includes with `-r`, in reading order."""
    files = [path]
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            files += requirement_files(path.parent / line.split(None, 1)[1])
    return files


def cache_key(path: Path, python: str, pip_version: str) -> str:
    digest = hashlib.sha256(f"{python}\n{pip_version}\n".encode())
    for file in requirement_files(path):
        digest.update(file.name.encode() + b"\n" + file.read_bytes())
    return digest.hexdigest()[:16]


def pinned(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of the file and its includes (lower-cased names)."""
    pins: dict[str, str] = {}
    for file in requirement_files(path):
        for line in file.read_text().splitlines():
            match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
            if match:
                pins[match.group(1).lower().replace("_", "-")] = match.group(3)
    return pins


def verdict_from(returncode: int, output: str, report: dict | None, pins: dict[str, str]) -> dict:
    """One verdict from pip's exit code, its output and its --report: ok, or the conflict, or unreachable."""
    if returncode == 0 and report is not None:
        resolved = {
            item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in report.get("install", [])
        }
        wrong = {name: (want, resolved.get(name)) for name, want in pins.items() if resolved.get(name) != want}
        if wrong:
            return {"status": "mismatch", "detail": f"pinned vs resolved: {wrong}", "resolved": resolved}
        return {"status": "ok", "resolved": resolved}
    lines = [line for line in output.splitlines() if not line.startswith("WARNING: Location")]
    if "ResolutionImpossible" in output or "conflicting dependencies" in output or "No matching distribution" in output:
        keep = [line for line in lines if "ERROR" in line or "depends on" in line or "requested" in line]
        return {"status": "conflict", "detail": "\n".join(keep[-12:]) or "\n".join(lines[-12:])}
    return {"status": "unreachable", "detail": "\n".join(lines[-8:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requirements", default="requirements-gpu.txt", help="File to resolve (default %(default)s).")
    parser.add_argument("--pip", default=None, help="pip to resolve with (default: this Python's `-m pip`).")
    parser.add_argument("--refresh", action="store_true", help="Ignore a cached verdict.")
    args = parser.parse_args(argv)
    path = (ROOT / args.requirements).resolve()
    pip = [args.pip] if args.pip else [sys.executable, "-m", "pip"]
    pip_version = subprocess.run([*pip, "--version"], capture_output=True, text=True).stdout.split(" ")[1]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    cache_root = Path(os.environ.get("TGRPO_CACHE_DIR") or Path.home() / ".cache" / "tgrpo") / "gpu-resolve"
    cache = cache_root / f"{cache_key(path, python, pip_version)}.json"
    label = f"{path.name} on Python {python} (pip {pip_version})"
    if cache.is_file() and not args.refresh:
        verdict = json.loads(cache.read_text())
        source = f"cached {cache}"
    else:
        print(f"check_gpu_resolve: resolving {label} against the package index (dry run) ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            report_path = Path(tmp) / "report.json"
            done = subprocess.run(
                [*pip, "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check", "--quiet"]
                + ["--report", str(report_path), "-r", str(path)],
                cwd=path.parent,
                capture_output=True,
                text=True,
            )
            report = json.loads(report_path.read_text()) if report_path.is_file() else None
        wanted = {name: version for name, version in pinned(path).items() if name in ("vllm", "torch")}
        verdict = verdict_from(done.returncode, done.stdout + done.stderr, report, wanted)
        source = "resolved now"
        if verdict["status"] != "unreachable":
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(verdict, indent=1, sort_keys=True))
    if verdict["status"] == "ok":
        resolved = verdict["resolved"]
        shown = ", ".join(f"{n} {resolved[n]}" for n in ("vllm", "torch", "numpy", "transformers") if n in resolved)
        print(f"check_gpu_resolve: OK, {label} resolves to {len(resolved)} packages ({shown}); {source}")
        return 0
    if verdict["status"] == "unreachable":
        print(f"check_gpu_resolve: could not ask the package index for {label}:\n{verdict['detail']}", file=sys.stderr)
        return 2
    print(f"check_gpu_resolve: FAIL, {label} does not resolve ({source}):\n{verdict['detail']}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
