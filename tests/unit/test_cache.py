"""Shared answers (``daemon/web/cache.py``): one run per query per commit generation."""

from __future__ import annotations

import anyio


def test_identical_queries_in_one_commit_generation_run_once_and_a_commit_runs_them_again() -> None:
    from trainvigil.daemon.web.cache import SharedAnswers

    generation, runs = [0], []

    async def scenario() -> list[int]:
        shared: SharedAnswers[int] = SharedAnswers(lambda: generation[0])
        gate = anyio.Event()

        async def run() -> int:
            runs.append(generation[0])
            await gate.wait()
            return len(runs)

        answers: list[int] = []

        async def ask() -> None:
            answers.append(await shared.get("q", run))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        generation[0] += 1
        answers.append(await shared.get("q", run))
        return answers

    assert anyio.run(scenario, backend="asyncio") == [1, 1, 1, 1, 1, 2]
    assert runs == [0, 1]
