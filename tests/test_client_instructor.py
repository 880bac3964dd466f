"""instructor (``instructor.from_openai``, its default mode: TOOLS) against a live
``ortgen serve`` of the default model, from a venv of its own (tests/client_venvs.py says
why): ``response_model`` with a flat and a nested model, sync and async. instructor
turns the model into a forced tool call and validates the call's arguments; here the
subprocess prints what it got and the test checks it with the same Pydantic models, and
that each request was a chat completion (``/metrics``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.client_venvs import instructor_python
from tests.server_helpers import KEY, ServerProcess, metric

pytestmark = pytest.mark.default_model

SCRIPT = """
import asyncio, json, sys
import instructor, openai
from pydantic import BaseModel, Field

class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)

class Cities(BaseModel):
    cities: list[City] = Field(min_length=1, max_length=3)

url, key = sys.argv[1:3]
client = instructor.from_openai(openai.OpenAI(base_url=url, api_key=key, max_retries=0))
city = client.chat.completions.create(
    model="x", response_model=City,
    messages=[{"role": "user", "content": "Name a city in France."}],
)
nested = client.chat.completions.create(
    model="x", response_model=Cities,
    messages=[{"role": "user", "content": "Name French cities."}],
)
aclient = instructor.from_openai(openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0))
later = asyncio.run(aclient.chat.completions.create(
    model="x", response_model=City,
    messages=[{"role": "user", "content": "Name a city in Spain."}],
))
print(json.dumps({"mode": client.mode.value, "openai": openai.__version__,
                  "city": city.model_dump(), "cities": nested.model_dump(),
                  "async": later.model_dump()}))
"""


class City(BaseModel):
    name: str
    country: str


class Cities(BaseModel):
    cities: list[City]


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model", str(default_model_dir), "--threads", "1") as server:
        yield server


def test_instructor_response_model_in_its_default_mode(
    server: ServerProcess, pytestconfig: pytest.Config
) -> None:
    python = instructor_python(pytestconfig.cache.mkdir("client-venvs"))
    done = subprocess.run(
        [str(python), "-c", SCRIPT, f"{server.url}/v1", KEY],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["mode"] == "tool_call"  # instructor.Mode.TOOLS
    City.model_validate(got["city"])
    City.model_validate(got["async"])
    assert Cities.model_validate(got["cities"]).cities
    chat = metric(server, "ortgen_http_requests_total", route="/v1/chat/completions", code="200")
    assert chat == 3  # this module's server answered nothing else
