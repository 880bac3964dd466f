"""``ortgen serve --ray``: the app as Ray Serve replicas on a real Ray cluster (a head
node on 127.0.0.1, 2 CPUs, token auth: test_jobs_ray's), driven through Ray Serve's
proxy by the official OpenAI client.

The reference is the single-process server: the same tiny fp32 fused Llama (character
tokenizer, chat template) served by ``ortgen serve`` in another process, asked the same
requests; greedy answers must be equal (fp32: a batch's arithmetic differs by ~1e-5, far
below the tiny model's top-1 gaps; tests/test_server.py). The module's server runs two
replicas of one thread each; its tests run in order, and the last one drains it.

Replicas are listed and killed by their actor names (``SERVE_REPLICA::ortgen#
OrtgenReplica#ID``, the ID that /metrics labels them with) in a subprocess that joins
the cluster, so this process never runs ``ray.init``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.server_helpers import KEY, ROOT, ServerProcess, call, sum_of
from tests.sockets import LOOPBACK, listening_addresses
from tests.test_jobs_ray import _env as ray_env
from tests.test_jobs_ray import ray_address  # noqa: F401 - the module's cluster
from tests.tiny_models import export_tiny

pytestmark = pytest.mark.ray
#: the test plugin by its file (a replica imports it by path): its ``slow`` processor
#: keeps a request running while a test acts, and changes no score
PLUGIN = ("--plugin", str(ROOT / "tests" / "server_plugin.py"))
SLOW = {"logits_processors": [{"name": "slow", "delay": 0.05}]}

PREFIX = "SERVE_REPLICA::ortgen#OrtgenReplica#"
#: lists the replicas' ids (and kills the one given) on the cluster at argv[1]
_REPLICAS = textwrap.dedent(
    f"""
    import json, sys, ray
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    if len(sys.argv) > 2:
        ray.kill(ray.get_actor({PREFIX!r} + sys.argv[2], namespace="serve"), no_restart=True)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    print(json.dumps(sorted(n[{len(PREFIX)}:] for n in names if n.startswith({PREFIX!r}))))
    """
)


def replicas(address: str, kill: str | None = None) -> list[str]:
    """The ids of the replicas alive now (after killing ``kill``)."""
    args = [sys.executable, "-c", _REPLICAS, address, *([kill] if kill else [])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=ray_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def series(server: ServerProcess, name: str, **labels: str) -> dict[str, float]:
    """``name``'s value per replica label (its ``all`` total too) in one scrape."""
    _, text = call(server, "/metrics")
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'replica="' in line:
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            try:
                values[replica] = sum_of(text, name, **labels, replica=replica)
            except KeyError:
                continue
    return values


def wait_for(check, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny(
        "llama", tmp_path_factory.mktemp("ray-serve"), with_tokenizer=True, graph="fused"
    )


@pytest.fixture(scope="module")
def single(tiny_dir):
    """The reference: the single-process server on the same model."""
    server = ServerProcess("--model", str(tiny_dir), "--threads", "1", "--api-key", KEY, *PLUGIN)
    try:
        yield server.ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def served(ray_address, tiny_dir):  # noqa: F811 - the imported fixture
    """Two replicas of one thread on the module's cluster, behind Serve's proxy."""
    server = ServerProcess(
        "--ray", ray_address, "--replicas", "2", "--model", str(tiny_dir), "--threads", "1",
        "--api-key", KEY, "--grace", "20", *PLUGIN, env=ray_env(),
    )  # fmt: skip
    try:
        yield server.ready(timeout=240)
    finally:
        server.stop()


def _request(i: int) -> tuple[str, dict]:
    """The i-th request of a mix: chat and completions, streamed and not, greedy."""
    words = ["hello there", "tell me more", "abc", "the cat sat", "why so", "ok then"]
    prompt = f"{words[i % len(words)]} {i}"
    body: dict = {"model": "served", "max_tokens": 6 + i % 11, "temperature": 0}
    if i % 2:
        return "chat", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "completion", {**body, "prompt": prompt}


async def _answer(client: openai.AsyncOpenAI, kind: str, body: dict, stream: bool) -> tuple:
    """(text, finish_reason) of one request, streamed or whole."""
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    if not stream:
        out = await create(**body)
        choice = out.choices[0]
        text = choice.message.content if kind == "chat" else choice.text
        return text, choice.finish_reason
    parts, finish = [], None
    async for chunk in await create(**body, stream=True):
        for choice in chunk.choices:
            piece = choice.delta.content if kind == "chat" else choice.text
            parts.append(piece or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


async def _answers(server: ServerProcess, count: int) -> list[tuple]:
    client = server.async_client()
    jobs = [_answer(client, *_request(i), stream=i % 3 == 0) for i in range(count)]
    return await asyncio.gather(*jobs)


def test_two_replicas_answer_40_concurrent_requests_as_one_server(served, single, ray_address):  # noqa: F811
    """40 requests at once through the proxy (a quarter chat, a quarter completions, a
    third streamed): each answer is the single-process server's to the same request,
    both replicas answered some, and /metrics counts every one, per replica and in total."""
    routes = ("/v1/chat/completions", "/v1/completions")
    before = {r: series(served, "ortgen_http_requests_total", route=r, code="200") for r in routes}
    got = asyncio.run(_answers(served, 40))
    expected = asyncio.run(_answers(single, 40))
    assert got == expected
    assert all(text for text, _ in got)

    def counted() -> dict[str, dict[str, float]] | None:
        now = {r: series(served, "ortgen_http_requests_total", route=r, code="200") for r in routes}
        new = {
            r: {k: v - before[r].get(k, 0.0) for k, v in now[r].items()} for r in routes
        }  # fmt: skip
        return new if all(new[r].get("all") == 20 for r in routes) else None

    new = wait_for(counted, what="/metrics to count the 40 requests")
    for route in routes:
        per_replica = {k: v for k, v in new[route].items() if k != "all"}
        assert sorted(per_replica) == replicas(ray_address)
        assert sum(per_replica.values()) == 20
    both = {k: new[routes[0]][k] + new[routes[1]][k] for k in per_replica}
    assert all(v > 0 for v in both.values()), both  # the proxy used both replicas


def test_health_metrics_and_the_api_key_through_the_proxy(served, ray_address):  # noqa: F811
    status, body = call(served, "/health", key=None)
    assert status == 200 and body["status"] == "ok"
    for key in (None, "wrong"):
        status, body = call(served, "/v1/models", key=key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _ = call(served, "/metrics", key=key)
        assert status == 401
    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="wrong").completions.create(model="x", prompt="hi", max_tokens=2)
    status, body = call(served, "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [served.model]
    ids = replicas(ray_address)
    # the other replica's series are as of its last report (about a second old)
    wait_for(
        lambda: (
            series(served, "ortgen_model_loaded", model=served.model)
            == {**dict.fromkeys(ids, 1.0), "all": 2.0}
        ),
        10,
        "both replicas' series in /metrics",
    )


def test_a_killed_replica_fails_its_requests_cleanly_and_is_replaced(served, single, ray_address):  # noqa: F811
    """Long streams on both replicas, one replica killed: each of its requests ends in
    an error (no hang), the other's finish with the single server's text, Serve starts
    a replacement, and /metrics moves from the dead replica to the new one."""
    long = {"max_tokens": 60, "temperature": 0, "extra_body": {"min_new_tokens": 60, **SLOW}}
    bodies = [("completion", {"model": "served", "prompt": f"story {i}", **long}) for i in range(8)]

    async def run() -> list:
        client = served.async_client()
        jobs = [asyncio.ensure_future(_answer(client, k, b, stream=True)) for k, b in bodies]
        busy = await asyncio.to_thread(
            wait_for,
            lambda: [
                r
                for r, v in series(served, "ortgen_requests_in_flight").items()
                if r != "all" and v > 0
            ],
            30,
            "requests in flight",
        )
        victim = busy[0]
        await asyncio.to_thread(replicas, ray_address, victim)
        results = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 120)
        return [victim, results]

    before = set(series(served, "ortgen_info")) - {"all"}
    victim, results = asyncio.run(run())
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed, "no request was on the killed replica"
    assert all(isinstance(e, openai.APIError) for e in failed), failed
    expected = asyncio.run(_reference(single, bodies))
    finished = [
        (r, e) for r, e in zip(results, expected, strict=True) if not isinstance(r, BaseException)
    ]
    assert finished and all(r == e for r, e in finished)
    (survivor,) = before - {victim}

    def replaced() -> set[str] | None:
        ids = set(series(served, "ortgen_info")) - {"all"}
        return ids if len(ids) == 2 and victim not in ids else None

    ids = wait_for(replaced, 120, "a replacement replica in /metrics")
    assert survivor in ids and sorted(ids) == replicas(ray_address)
    assert call(served, "/health", key=None)[0] == 200
    assert asyncio.run(_answers(served, 4)) == asyncio.run(_answers(single, 4))


async def _reference(server: ServerProcess, bodies: list) -> list:
    client = server.async_client()
    return await asyncio.gather(*(_answer(client, k, b, stream=True) for k, b in bodies))


def test_a_second_server_on_the_same_cluster_is_refused(served, tiny_dir, ray_address):  # noqa: F811
    """Serve would replace the running application with the new one: refused instead,
    in one line, and the first server goes on answering."""
    args = [sys.executable, "-m", "ortgen.cli", "serve", "--ray", ray_address, "--model"]
    args += [str(tiny_dir), "--threads", "1", "--port", served.url.rsplit(":", 1)[1]]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=ray_env())
    assert done.returncode == 2, done.stderr
    assert done.stderr.endswith(
        "ortgen: error: an application called 'ortgen' already runs on this cluster's Ray "
        "Serve (another `ortgen serve --ray`?): stop it first (serve.delete)\n"
    )
    assert call(served, "/health", key=None)[0] == 200


def test_sigterm_drains_every_replica_then_removes_the_application(served, single, ray_address):  # noqa: F811
    """SIGTERM: the streams in flight finish with the single server's text, a new request
    gets the single server's 503 (``shutting_down``), the driver exits 0, and the
    application and Serve's proxy are gone (nothing else ran on the cluster's Serve)."""
    long = {"max_tokens": 60, "temperature": 0, "extra_body": {"min_new_tokens": 60, **SLOW}}
    bodies = [
        ("chat", {"model": "served", "messages": [{"role": "user", "content": f"go {i}"}], **long})
        for i in range(4)
    ]

    async def run():
        client = served.async_client()
        jobs = [asyncio.ensure_future(_answer(client, k, b, stream=True)) for k, b in bodies]
        await asyncio.to_thread(
            wait_for,
            lambda: series(served, "ortgen_requests_in_flight").get("all", 0) >= 4,
            30,
            "4 requests in flight",
        )
        served.terminate()
        refused = await asyncio.to_thread(
            wait_for, lambda: (s := call(served, "/health", key=None))[0] == 503 and s, 10
        )
        late = {"model": "served", "messages": [{"role": "user", "content": "hi"}]}
        status, body = call(served, "/v1/chat/completions", late)
        return await asyncio.gather(*jobs), refused, (status, body)

    answers, refused, (status, body) = asyncio.run(run())
    assert answers == asyncio.run(_reference(single, bodies))
    assert refused[1]["status"] == "shutting_down"
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert served.proc.wait(60) == 0, served.log()
    assert "ortgen serve: stopped" in served.log()
    assert replicas(ray_address) == []
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{served.url}/health", timeout=5)


def test_without_an_address_ray_starts_here_on_the_loopback_address_only(tiny_dir, single):
    """``--ray`` alone: a Ray of the server's own, every process of it (and Serve's
    proxy) listening on 127.0.0.1 only; it answers as the single server, and SIGTERM
    ends it all."""

    server = ServerProcess(
        "--ray", "--model", str(tiny_dir), "--threads", "1", "--api-key", KEY, env=ray_env()
    )
    try:
        server.ready(timeout=240)
        assert asyncio.run(_answers(server, 2)) == asyncio.run(_answers(single, 2))
        listening = listening_addresses(server.proc.pid)
        assert listening and listening <= LOOPBACK, listening
        server.terminate()
        assert server.proc.wait(60) == 0, server.log()
    finally:
        server.stop()


def test_without_ray_serve_it_is_one_line_naming_the_extra():
    """ortgen imports without Ray; ``--ray`` then says what to install."""
    script = (
        "import sys, runpy; sys.modules['ray'] = None; import ortgen.serve.ray_serve; "
        "sys.argv = ['ortgen', 'serve', '--ray']; "
        "runpy.run_module('ortgen.cli', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "ortgen: error: ortgen serve --ray needs Ray (ray[serve]), which is not installed: "
        "pip install 'ortgen[ray]'\n"
    )
