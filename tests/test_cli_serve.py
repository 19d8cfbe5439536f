"""``asyncsearch serve`` and ``asyncsearch demo``: the emulator from the command line."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from asyncsearch import AsyncSearchClient, AuthenticationError

from .cli_helpers import cli_env, finish, read_jsonl, run_cli, start_cli
from .helpers import TIME_SCALE

EXPORT_LINE = re.compile(
    r"export ASYNCSEARCH_BASE_URL=(?P<url>\S+) ASYNCSEARCH_API_KEY=(?P<key>\S+)"
)


async def _read_until(stream: asyncio.StreamReader, marker: str, timeout: float = 20.0) -> str:
    text = ""
    async with asyncio.timeout(timeout):
        while marker not in text:
            line = await stream.readline()
            if not line:
                break
            text += line.decode()
    return text


async def test_serve_prints_a_working_url_and_key_and_stops_on_ctrl_c() -> None:
    process = await start_cli("serve", "--port", "0", "--jobs", "5", env=cli_env())
    try:
        assert process.stdout is not None
        banner = await _read_until(process.stdout, "Press Ctrl-C to stop.")
        found = EXPORT_LINE.search(banner)
        assert found is not None, banner
        url, key = found["url"], found["key"]
        assert url.startswith("http://127.0.0.1:")
        async with AsyncSearchClient(api_key=key, base_url=url) as client:
            page = await client.search("invoice")
            assert page.total > 0
            with pytest.raises(AuthenticationError):
                await client.with_options(api_key="not-" + key, max_retries=0).search("invoice")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        result = await finish(process)
    assert result.code == 0, result.stderr
    assert result.stdout.strip().endswith("stopped")
    assert "Traceback" not in result.stderr


async def test_serve_with_a_given_key_does_not_print_it() -> None:
    secret = "given-key-Hn47"
    process = await start_cli(
        "serve", "--port", "0", "--jobs", "0", env=cli_env(ASYNCSEARCH_API_KEY=secret)
    )
    try:
        assert process.stdout is not None
        banner = await _read_until(process.stdout, "Press Ctrl-C to stop.")
        url = re.search(r"export ASYNCSEARCH_BASE_URL=(\S+)", banner)
        assert url is not None, banner
        async with AsyncSearchClient(api_key=secret, base_url=url[1]) as client:
            assert (await client.search("invoice")).total > 0
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        result = await finish(process)
    assert result.code == 0, result.stderr
    assert secret not in banner + result.output


async def test_serve_refuses_a_host_that_is_not_loopback() -> None:
    result = await run_cli("serve", "--host", "0.0.0.0", "--port", "0", env=cli_env())
    assert result.code == 2
    assert "--allow-remote" in result.stderr
    assert result.stdout == ""


async def test_demo_runs_every_section_without_configuration() -> None:
    result = await run_cli("demo", env=cli_env(), timeout=50 * TIME_SCALE)
    assert result.code == 0, result.stderr
    for heading in (
        "1. Search",
        "2. Walking pages",
        "3. Bulk fetch with retries",
        "4. Link preview",
        "5. Webhook logs",
    ):
        assert heading in result.stdout
    assert "305: 300 ok, 5 failed (5 NotFoundError)" in result.stdout
    assert re.search(r"of which [1-9]\d* got a 503 and were retried", result.stdout)
    assert "Done in" in result.stdout
    assert "Traceback" not in result.stderr


async def test_serve_on_a_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await run_cli("serve", "--port", str(port), env=cli_env())
    assert result.code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


async def test_serve_write_ids_then_extract_many_from_a_shell(tmp_path: Path) -> None:
    python = shlex.quote(sys.executable)
    server = await asyncio.create_subprocess_shell(
        f"exec {python} -m asyncsearch serve --port 0 --jobs 7 --write-ids ids.txt",
        cwd=tmp_path,
        env=cli_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        # The banner is printed once the ids file is complete: it is the readiness signal.
        banner = await _read_until(server.stdout, "Press Ctrl-C to stop.")
        found = EXPORT_LINE.search(banner)
        assert found is not None, banner
        assert "extract-many ids.txt -o results.jsonl" in banner
        ids = (tmp_path / "ids.txt").read_text().splitlines()
        assert len(ids) == 7
        assert all(re.fullmatch(r"[0-9a-f-]{36}", i) for i in ids)
        env = cli_env(ASYNCSEARCH_BASE_URL=found["url"], ASYNCSEARCH_API_KEY=found["key"])
        export = await asyncio.create_subprocess_shell(
            f"{python} -m asyncsearch extract-many ids.txt -o out.jsonl",
            cwd=tmp_path,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        exported = await finish(export)
    finally:
        if server.returncode is None:
            server.send_signal(signal.SIGINT)
        served = await finish(server)
    assert exported.code == 0, exported.stderr
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(line["jobId"] for line in lines) == sorted(ids)
    assert all(line["ok"] and line["job"]["id"] == line["jobId"] for line in lines)
    assert served.code == 0, served.stderr


async def test_serve_write_ids_to_a_missing_folder_fails_cleanly(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "ids.txt"
    result = await run_cli("serve", "--port", "0", "--write-ids", str(missing), env=cli_env())
    assert result.code == 2  # checked before listening: a usage error
    assert f"cannot open the output file {missing} (--write-ids)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("strict", [False, True])
async def test_serve_strict_refuses_what_the_spec_leaves_open(strict: bool) -> None:
    flags = ["--strict"] if strict else []
    process = await start_cli("serve", "--port", "0", "--jobs", "0", *flags, env=cli_env())
    try:
        assert process.stdout is not None
        banner = await _read_until(process.stdout, "Press Ctrl-C to stop.")
        found = EXPORT_LINE.search(banner)
        assert found is not None, banner
        async with (
            aiohttp.ClientSession(
                found["url"],
                headers={"X-Api-Key": found["key"]},
                timeout=aiohttp.ClientTimeout(total=20),
            ) as http,
            http.post("/v2/search", json={"text": "invoice", "bogus": 1}) as response,
        ):
            assert response.status == (422 if strict else 200)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        result = await finish(process)
    assert result.code == 0, result.stderr
