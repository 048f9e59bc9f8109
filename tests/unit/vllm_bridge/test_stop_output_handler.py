"""vllm_bridge.compat.stop_output_handler: before a planned engine stop the AsyncLLM's output task is cancelled
(else it may read the dead EngineCore first and log an EngineDeadError traceback at a CPU sleep), but never
while a request is unfinished (that task is what hands the engine's end to waiting streams)."""

from __future__ import annotations

import asyncio

from vllm_bridge.compat import stop_output_handler


class _Client:
    """The two AsyncLLM attributes the function reads (vLLM 0.26 and 0.32 names)."""

    def __init__(self, handler, unfinished: int) -> None:
        self.output_handler = handler
        self.unfinished = unfinished

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


async def _forever() -> None:
    await asyncio.Event().wait()


def test_an_idle_engines_output_task_is_cancelled():
    async def run():
        task = asyncio.ensure_future(_forever())
        assert stop_output_handler(_Client(task, 0))
        await asyncio.sleep(0)
        return task.cancelled()

    assert asyncio.run(run())


def test_a_task_feeding_an_unfinished_request_is_left_running():
    async def run():
        task = asyncio.ensure_future(_forever())
        assert not stop_output_handler(_Client(task, 1))
        await asyncio.sleep(0)
        running = not task.done()
        task.cancel()
        return running

    assert asyncio.run(run())


def test_no_task_or_a_finished_one_is_nothing_to_do():
    assert not stop_output_handler(_Client(None, 0))
    assert not stop_output_handler(object())

    async def run():
        task = asyncio.ensure_future(asyncio.sleep(0))
        await task
        return stop_output_handler(_Client(task, 0))

    assert not asyncio.run(run())
