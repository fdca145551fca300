"""Executors (spec/executors.md): whatever the executor and worker count, the output of a
search is the same byte for byte; the pool spawns its workers at once, rebuilds each
worker's state from the recipe once, keeps chunks contiguous and results in order,
silences its workers, and closes cleanly."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest
from cli_runs import DEMO, MOE, SMALL, search_outputs

from ndplan.adapters.executors.pool import PoolExecutor, split
from ndplan.cli.app import run
from ndplan.cli.executors import choose, default_jobs
from ndplan.core.errors import InternalError

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"

# --------------------------------------------------------------- byte-identical outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("problem", "ranking"),
    [
        (DEMO, False),
        (MOE, False),
        ([*MOE, "--distinct", "--baseline", "tp=2,ep=4,pp=2"], False),
        (SMALL, True),
    ],
    ids=[
        "llama-3-70b",
        "mixtral-8x7b",
        "mixtral-8x7b-one-per-grid-and-a-baseline",
        "llama-3-8b-every-plan-ranked",
    ],
)
def test_pool_output_is_byte_identical_to_serial(
    problem: list[str], ranking: bool, tmp_path: Path
) -> None:
    serial = search_outputs(tmp_path / "serial", problem, "-j", "1", ranking=ranking)
    pool = search_outputs(tmp_path / "pool", problem, "-j", "2", ranking=ranking)
    assert set(serial) == set(pool)
    assert {"debug/debug_mem.csv", "debug/debug_perf.csv"} <= set(serial)
    assert ("ranking.csv" in serial) == ranking
    for name in serial:
        assert pool[name] == serial[name], f"{name} differs between -j 1 and -j 2"


# --------------------------------------------------------------- selection


def test_selection_follows_jobs_env_and_verbosity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NDPLAN_JOBS", raising=False)
    assert 1 <= default_jobs() <= 4
    assert default_jobs() == max(1, min(4, (os.cpu_count() or 1) // 2))
    monkeypatch.setenv("NDPLAN_JOBS", "3")
    assert choose(None, None, 0) == ("pool", 3)
    assert choose(1, None, 0) == ("serial", 1)
    assert choose(2, "ray", 0) == ("ray", 2)
    assert choose(4, None, 2) == ("serial", 1)  # a line per candidate: one process
    assert choose(2, None, 0, "ray://head:10001") == ("ray", 2)


def test_ray_address_with_another_executor_is_invalid(capsys: pytest.CaptureFixture) -> None:
    code = run(["search", *DEMO, "--executor", "pool", "--ray-address", "auto"])
    assert code == 3
    assert "--ray-address" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_address_nothing_answers_at_is_one_line_at_once(
    scheme: str, capsys: pytest.CaptureFixture
) -> None:
    """ray.init retried such an address for minutes, logging each try; now the address
    is tried first (a refused port answers at once) and refused in one line."""
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port nothing listens on: bound, then released
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"{scheme}127.0.0.1:{port}"
    code = run(["search", *DEMO, "--ray-address", address])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1, err
    assert err[0].startswith(f"ndplan: error: --ray-address {address}: nothing answers at ")
    assert "ray start --head" in err[0]
    code = run(["search", *DEMO, "--ray-address", "head:port"])
    assert code == 3 and "the port 'port' is not a number" in capsys.readouterr().err


def test_executor_ray_without_ray_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    code = run(["search", *DEMO, "--executor", "ray"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1
    assert "pip install 'ndplan[ray]'" in err[0]


def test_unknown_executor_lists_the_known_ones(capsys: pytest.CaptureFixture) -> None:
    assert run(["search", *DEMO, "--executor", "dask"]) == 3
    err = capsys.readouterr().err
    assert "pool" in err and "serial" in err


def test_chunks_are_contiguous_about_eight_per_worker() -> None:
    items = list(range(1000))
    for workers in (1, 2, 3, 4):
        chunks = split(items, workers)
        assert [i for c in chunks for i in c] == items
        assert abs(len(chunks) - 8 * workers) <= 1
    assert split(list(range(5)), 4) == [[0], [1], [2], [3], [4]]  # at least one item each


# --------------------------------------------------------------- the pool itself


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch):
    """The helper tasks, importable here and in spawned workers (they inherit sys.path)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    import executor_tasks

    return executor_tasks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_pool_results_by_position_recipe_rebuilt_once_per_worker(tasks) -> None:
    pool = PoolExecutor(2)
    try:
        pids = pool.pids
        assert len(pids) == 2 and all(alive(p) for p in pids)  # started in the constructor
        recipe = tasks.CountingRecipe(7)
        items = list(range(203))
        for _ in range(3):
            out = pool.map(tasks.echo, recipe, items)
            assert [i for chunk in out for i in chunk["items"]] == items
            assert len(out) == len(split(items, 2))
        assert {chunk["pid"] for chunk in out} <= set(pids)
        assert max(chunk["loads"] for chunk in out) == 1  # unpickled once per worker
        assert pool.map(tasks.echo, recipe, []) == []
    finally:
        pool.close()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


@pytest.mark.slow
def test_pool_workers_see_the_environment_they_were_started_in(
    tasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers fork from a server started earlier (by the first pool); each still sees
    the main process's environment as it was when its pool started, as spawned ones do,
    and starts with the knapsack kernels already loaded."""
    first = PoolExecutor(1)
    try:
        assert first.map(tasks.environ, "NDPLAN_TEST_MARK", [0]) == [[None]]
    finally:
        first.close()
    monkeypatch.setenv("NDPLAN_TEST_MARK", "set after the first pool")
    pool = PoolExecutor(2)
    try:
        out = pool.map(tasks.environ, "NDPLAN_TEST_MARK", list(range(4)))
        assert [v for chunk in out for v in chunk] == ["set after the first pool"] * 4
        if "forkserver" in multiprocessing.get_all_start_methods():
            assert all(v for chunk in pool.map(tasks.warmed, None, [0, 1]) for v in chunk)
    finally:
        pool.close()


@pytest.mark.slow
def test_pool_workers_are_silent_and_errors_terminate_them(tasks, capfd) -> None:
    pool = PoolExecutor(2)
    pids = pool.pids
    try:
        assert pool.map(tasks.chatty, None, list(range(10))) == [[i] for i in range(10)]
        captured = capfd.readouterr()
        assert "should go nowhere" not in captured.out + captured.err
        with pytest.raises(InternalError, match="ZeroDivisionError: item 5 divides by zero"):
            pool.map(tasks.fail_on, 5, list(range(10)))
    finally:
        pool.terminate()
    assert not any(alive(p) for p in pids)
    with pytest.raises(InternalError, match="closed"):
        pool.map(tasks.echo, None, [1])


@pytest.mark.slow
def test_pool_raises_the_failure_of_the_earliest_chunk(tasks) -> None:
    """The error a serial run meets first, whichever worker answered first."""
    pool = PoolExecutor(2)
    try:
        with pytest.raises(InternalError, match="chunk from item 0 divides by zero"):
            pool.map(tasks.fail_slow_then_fast, 0.5, list(range(10)))
    finally:
        pool.terminate()
