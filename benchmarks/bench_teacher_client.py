"""Teacher client throughput vs the ideal, against a local server with a fixed answer delay.

    python -m benchmarks.bench_teacher_client [--delay 0.5] [--concurrency 1 8 32 64] [--rounds 6]

With every request answered after exactly `delay` seconds, a client keeping `c` requests in flight
can at best complete c / delay requests per second. For each concurrency level this sends
c x rounds requests through `clients.openai_compat.TeacherClient` (the code phase 2 uses) and
reports achieved requests/s as a share of that ideal. The server is the tests' fake
OpenAI-compatible server (uvicorn, one process, asyncio), run in its own process so that it does
not share the client's event loop or interpreter lock.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
import urllib.request

from clients.openai_compat import TeacherClient
from tests.fake_openai_server import FakeTeacher, build_app, free_port
from utils.prompts import build_chat_messages


def serve(port: int, delay: float) -> None:
    import uvicorn

    uvicorn.run(
        build_app(FakeTeacher(delay=delay, port=port, shape="reasoning")),
        host="127.0.0.1",
        port=port,
        log_level="error",
        backlog=4096,
        limit_concurrency=100_000,
    )


async def measure(url: str, concurrency: int, total: int) -> tuple[float, int]:
    async with TeacherClient(url, "fake-teacher", max_concurrency=concurrency, max_tokens=64) as client:
        await client.complete(build_chat_messages("warm up"))  # open the connection pool first
        start = time.perf_counter()
        responses = await asyncio.gather(*(client.complete(build_chat_messages(f"task {i}")) for i in range(total)))
        elapsed = time.perf_counter() - start
    return elapsed, sum(r.ok for r in responses)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_teacher_client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--delay", type=float, default=0.5, help="Seconds the server waits before each answer.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64], help="Levels to measure.")
    parser.add_argument("--rounds", type=int, default=6, help="Requests per level = concurrency x rounds.")
    args = parser.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.delay), daemon=True)
    server.start()
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1"
    print(f"server delay {args.delay} s; requests per level = concurrency x {args.rounds}\n")
    print(f"{'concurrency':>11s} {'requests':>9s} {'ideal req/s':>12s} {'achieved':>9s} {'share':>7s}")
    try:
        for concurrency in args.concurrency:
            total = concurrency * args.rounds
            elapsed, ok = asyncio.run(measure(url, concurrency, total))
            ideal = concurrency / args.delay
            achieved = total / elapsed
            print(
                f"{concurrency:11d} {total:9d} {ideal:12.1f} {achieved:9.1f} {achieved / ideal:6.1%}"
                + ("" if ok == total else f"  ({total - ok} failed)")
            )
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
