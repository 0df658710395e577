"""A stand-in for the interpreter that scripts/run_pipeline.sh calls (tests/e2e/test_run_pipeline.py).

Each phase script exits 0 at once and logs its name and pid; the local teacher (`-m scripts.serve_local_teacher`)
serves `/health` (answering as the kv engine when STUB_TEACHER_ENGINE=kv; ignoring SIGTERM when
STUB_TEACHER_IGNORES_TERM=1; phase 2 kills it and exits 3 when STUB_PHASE2_KILLS_TEACHER=1); `-c` (the script's
config query) prints the cpu preset's max_tokens; any other `-m` (the closing summary) writes its arguments to
summary_args; test_all.py logs its --teacher mode.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import time
from pathlib import Path


def log(name: str) -> None:
    with open(os.environ["STUB_LOG"], "a") as out:
        out.write(f"{name} {os.getpid()}\n")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        engine = os.environ.get("STUB_TEACHER_ENGINE")  # kv: answer as the kv engine's /health does
        self.wfile.write(json.dumps({"status": "ok", "engine": engine} if engine else {}).encode())

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    if sys.argv[1] == "-c":
        print(160)
        return 0
    teacher = sys.argv[1:3] == ["-m", "scripts.serve_local_teacher"]
    if sys.argv[1] == "-m" and not teacher:  # the closing summary: its arguments, for the tests to read
        Path(os.environ["STUB_LOG"]).with_name("summary_args").write_text(json.dumps(sys.argv[2:]))
        return 0
    name = "serve_local_teacher" if teacher else Path(sys.argv[1]).stem
    if name == "serve_local_teacher":
        log("teacher")
        if os.environ.get("STUB_TEACHER_IGNORES_TERM") == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
        return 0
    if name.startswith("phase2"):
        log("phase2")
        Path(os.environ["STUB_LOG"]).with_name("phase2_args").write_text(" ".join(sys.argv[2:]))
        if os.environ.get("STUB_PHASE2_KILLS_TEACHER") == "1":  # the teacher dies mid-phase: requests fail
            for line in Path(os.environ["STUB_LOG"]).read_text().splitlines():
                if line.startswith("teacher "):
                    os.kill(int(line.split()[1]), signal.SIGKILL)
            time.sleep(0.5)
            return 3
        try:
            time.sleep(float(os.environ.get("STUB_PHASE2_SLEEP", "0")))
        except KeyboardInterrupt:
            return 130
        return 0
    if name.startswith("phase3"):  # the thread-wait policy the training phase runs with
        Path(os.environ["STUB_LOG"]).with_name("phase3_omp").write_text(os.environ.get("OMP_WAIT_POLICY", "unset"))
    if name == "test_all":  # which teacher check: --teacher check|skip|only
        args = sys.argv[2:]
        name += ":" + (args[args.index("--teacher") + 1] if "--teacher" in args else "check")
    log(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
