"""TRL's server habit (`trl vllm-serve`, a URL without /v1) is recognized before any model loads, in one line."""

from __future__ import annotations

import http.server
import threading

import pytest

import phase2_generate_teacher_traces as phase2
import phase3_train_grpo as phase3
from tests.cli_helpers import TINY_STUDENT, cpu_argv
from tests.trainer_helpers import small_tasks
from utils.dataset_loader import write_tasks


class TrlVllmServeLike(http.server.BaseHTTPRequestHandler):
    """Answers as `trl vllm-serve` does: /health/ is 200, every OpenAI route is FastAPI's 404."""

    def do_GET(self) -> None:
        ok = self.path.rstrip("/") == "/health"
        body = b'{"status":"ok"}' if ok else b'{"detail":"Not Found"}'
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def trl_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TrlVllmServeLike)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_phase3_refuses_a_trl_vllm_serve_url_before_the_model_loads(tmp_path, trl_server, capsys, monkeypatch):
    import utils.student_model

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the student was loaded before the rollout server was checked")

    monkeypatch.setattr(utils.student_model, "load_student", no_load)
    train_file = write_tasks(tmp_path / "train.jsonl", small_tasks(2))
    argv = cpu_argv(
        "--output_dir",
        str(tmp_path / "out"),
        "--train_file",
        str(train_file),
        "--max_steps",
        "1",
        "--use_vllm",
        "--vllm_mode",
        "server",
        "--vllm_server_base_url",
        trl_server,  # TRL's form: no /v1
        sets=[TINY_STUDENT, "dual_source.teacher_sft_weight=0"],
    )
    assert phase3.cli(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert f"{trl_server}/v1/models answered 404" in errors[0]
    assert "`vllm serve MODEL` (not `trl vllm-serve`)" in errors[0]
    assert not (tmp_path / "out").exists()


def test_phase2_refuses_a_teacher_url_that_is_no_openai_server(tmp_path, trl_server, capsys):
    task_file = write_tasks(tmp_path / "tasks.jsonl", small_tasks(2))
    argv = cpu_argv(
        "--api_url", trl_server, "--model", "m", "--input", str(task_file), "--output", str(tmp_path / "t.jsonl")
    )
    assert phase2.cli(argv) != 0
    err = capsys.readouterr().err
    assert f"{trl_server}/models answered 404" in err
    assert f"the URL ends in /v1: {trl_server}/v1" in err
