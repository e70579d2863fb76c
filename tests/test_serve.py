"""nmt-serve as a client sees it: the real server in a subprocess on 127.0.0.1 (a free port),
real HTTP requests. Translations equal nmt-generate's, whatever else shares their batch;
concurrent clients get their own answers in order; every bad request gets its 4xx and a
one-line JSON reason; SIGTERM lets the request in flight finish, then exits 0."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from test_translator import WORDS, make_checkpoint, mixed_lines

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


class Server:
    """``nmt-serve ARGS --port 0`` in a subprocess, its stderr in a file; ``url`` once it
    listens, ``wait_ready()`` once its models are loaded."""

    def __init__(self, tmp: Path, *args, verbose: bool = False):
        self.log = tmp / f"serve-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "nmt.cli.serve", *map(str, args), "--port", "0",
               "--threads", "1", "--device", "cpu", *(["-v"] if verbose else [])]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, env=ENV)
        self.url = None

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.stderr())
            if m:
                return m
            assert self.proc.poll() is None, f"nmt-serve exited: {self.stderr()}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in nmt-serve's log: {self.stderr()}")

    def wait_ready(self, timeout: float = 60) -> "Server":
        self.url = "http://127.0.0.1:" + self.wait_for(r"listening on http://127\.0\.0\.1:(\d+)",
                                                       timeout).group(1)
        end = time.monotonic() + timeout
        while get(self.url + "/ready")[0] != 200:
            assert time.monotonic() < end, self.stderr()
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.proc.kill()


def request(url: str, body: bytes | None = None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str) -> tuple[int, dict | None]:
    try:
        return request(url, method="GET")
    except urllib.error.URLError:            # not listening yet
        return 0, None


def translate(url: str, **fields) -> list[str]:
    status, out = request(url + "/translate", json.dumps(fields).encode())
    assert status == 200, out
    assert list(out) == ["translations"]
    return out["translations"]


def generate(ckpt: Path, tmp: Path, lines: list[str], *options, jsonl: bool = False):
    """nmt-generate's translations of ``lines`` (the reference the server must match)."""
    src = tmp / f"in-{time.monotonic_ns()}.txt"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    fmt = ["--input-format", "jsonl"] if jsonl else []
    r = CliRunner().invoke(generate_main, ["-q", "--device", "cpu", str(ckpt), "-i", str(src),
                                           *fmt, *map(str, options)])
    assert r.exit_code == 0, r.stderr
    return r.stdout.split("\n")[:-1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "tiny.pt")


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    """One model; batches wait up to 300 ms, so concurrent requests share them; small limits."""
    s = Server(tmp_path_factory.mktemp("server"), ckpt, "--max-wait-ms", 300,
               "--max-request-bytes", 4000, "--max-sentences-per-request", 60,
               "--max-sentence-tokens", 30, "--max-beam", 6, verbose=True).wait_ready()
    yield s
    assert s.stop() == 0, s.stderr()


def test_translations_equal_nmt_generate_with_each_option(server, ckpt, tmp_path):
    lines = mixed_lines(40, seed=3)
    assert translate(server.url, text=lines) == generate(ckpt, tmp_path, lines)
    options = {"beam": 2, "lenpen": 0.2, "max_len_a": 0.5, "max_len_b": 4}
    assert translate(server.url, text=lines, **options) == generate(
        ckpt, tmp_path, lines, "--beam", 2, "--lenpen", 0.2, "--max-len-a", 0.5,
        "--max-len-b", 4)
    # forced prefixes: nmt-generate's jsonl "prefix", one per sentence or one for all
    prefixes = [None if i % 3 else WORDS[i % 7] for i in range(len(lines))]
    requests = [json.dumps({"source": s, "prefix": p}) for s, p in zip(lines, prefixes)]
    want = generate(ckpt, tmp_path, requests, jsonl=True)
    assert translate(server.url, text=lines, prefix=prefixes) == want
    assert all(w.startswith(p) for w, p, x in zip(want, prefixes, lines) if p and x.strip())
    requests = [json.dumps({"source": s, "prefix": "w5 w6"}) for s in lines]
    assert translate(server.url, text=lines, prefix="w5 w6") == generate(
        ckpt, tmp_path, requests, jsonl=True)
    assert translate(server.url, text=[]) == []
    # lexical constraints: nmt-generate's jsonl "constraints", a list per sentence or one
    # list for all (test_lexical_constraints)
    constraints = [None if i % 4 == 1 else [WORDS[i % 11], f"{WORDS[i % 5]} {WORDS[9]}"]
                   for i in range(len(lines))]
    requests = [json.dumps({"source": s, "constraints": c}) for s, c in zip(lines, constraints)]
    want = generate(ckpt, tmp_path, requests, jsonl=True)
    assert translate(server.url, text=lines, constraints=constraints) == want
    assert all(f" {w} " in f" {t} " for t, c, x in zip(want, constraints, lines)
               if c and x.strip() for w in c)
    requests = [json.dumps({"source": s, "constraints": ["w3", "w4 w5"], "prefix": "w6"})
                for s in lines]
    assert translate(server.url, text=lines, constraints=["w3", "w4 w5"], prefix="w6") == \
        generate(ckpt, tmp_path, requests, jsonl=True)
    # the decoding controls (test_decoding_controls), as nmt-generate's options
    controls = {"min_len": 3, "no_repeat_ngram_size": 2, "unkpen": 0.5, "beam": 4,
                "diverse_beam_groups": 2, "diverse_beam_strength": 0.3, "replace_unk": True}
    assert translate(server.url, text=lines, **controls) == generate(
        ckpt, tmp_path, lines, "--min-len", 3, "--no-repeat-ngram-size", 2, "--unkpen", 0.5,
        "--beam", 4, "--diverse-beam-groups", 2, "--diverse-beam-strength", 0.3, "--replace-unk")


def test_nbest_lists_are_nmt_generates(server, ckpt, tmp_path):
    lines = mixed_lines(20, seed=4)
    status, out = request(server.url + "/translate",
                          json.dumps({"text": lines, "beam": 4, "nbest": 3}).encode())
    assert status == 200 and list(out) == ["translations", "nbest"], out
    want = [json.loads(x) for x in generate(ckpt, tmp_path, lines, "--beam", 4, "--nbest", 3,
                                            "--output-format", "jsonl")]
    assert out["translations"] == [w["translation"] for w in want]
    for got, w, line in zip(out["nbest"], want, lines):
        hyps = w.get("nbest", [{"translation": w["translation"], "score": w["score"]}]
                     if w["score"] is not None else [])
        assert got == [{"translation": h["translation"], "score": h["score"]} for h in hyps]
        assert len(got) == (3 if line.strip() else 0)
        assert [h["score"] for h in got] == sorted((h["score"] for h in got), reverse=True)
    # the best of the list is the translation; nbest 1 is the plain reply
    assert [g[0]["translation"] for g, x in zip(out["nbest"], lines) if x.strip()] == \
        [t for t, x in zip(out["translations"], lines) if x.strip()]
    assert translate(server.url, text=lines, beam=4, nbest=1) == out["translations"]
    for bad, words in ((5, "nbest must be between 1 and the beam size (4), got 5"),
                       (0, "nbest must be between 1"), (1.5, '"nbest" must be an integer'),
                       (True, '"nbest" must be an integer')):
        status, err = request(server.url + "/translate",
                              json.dumps({"text": lines, "beam": 4, "nbest": bad}).encode())
        assert status == 400 and words in err["error"], err
        assert "\n" not in err["error"]


def test_samples_are_nmt_generates_for_each_request_whatever_shares_its_batch(server, ckpt,
                                                                             tmp_path):
    lines = mixed_lines(24, seed=5)
    options = {"sampling": True, "topk": 5, "temperature": 1.5, "seed": 7, "nbest": 2}
    flags = ("--sampling", "--topk", 5, "--temperature", 1.5, "--seed", 7, "--nbest", 2,
             "--output-format", "jsonl")

    def want(part):
        out = []
        for x in generate(ckpt, tmp_path, part, *flags):
            w = json.loads(x)
            out.append((w["translation"], w.get("nbest", [])))
        return out

    def got(reply):
        return [(t, [{"translation": h["translation"], "score": h["score"]} for h in hyps])
                for t, hyps in zip(reply["translations"], reply["nbest"])]

    halves = [lines[:12], lines[12:]]
    expected = [want(h) for h in halves]
    # Both halves at once, so they share batches: each request's sentences are seeded by
    # their position in that request, as nmt-generate seeds a file of them by line.
    before = len(re.findall(r"sentences from (\d+) requests", server.stderr()))
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda h: request(server.url + "/translate", json.dumps(
            {"text": h, **options}).encode()), halves))
    for (status, reply), exp in zip(replies, expected):
        assert status == 200 and list(reply) == ["translations", "nbest"], reply
        assert [(t, [{"translation": h["translation"], "score": h["score"]} for h in n])
                for t, n in exp] == got(reply)
    shared = [int(n) for n in re.findall(r"sentences from (\d+) requests",
                                         server.stderr())[before:]]
    assert max(shared) == 2, "the two requests were not decoded in one batch"
    # sampling is not beam search, and another seed draws other samples
    assert [t for t, _ in expected[0]] != generate(ckpt, tmp_path, halves[0])
    status, other = request(server.url + "/translate", json.dumps(
        {"text": halves[0], **options, "seed": 8}).encode())
    assert status == 200 and other["translations"] != [t for t, _ in expected[0]]
    one = translate(server.url, text=halves[0], sampling=True, seed=3)
    # the beam, which samples do not use, is not bounded for them (nmt-generate takes it too)
    assert translate(server.url, text=halves[0], sampling=True, seed=3, beam=100) == one
    assert one == generate(ckpt, tmp_path, halves[0], "--sampling", "--seed", 3)
    for fields, words in (({"topk": 5}, '"topk" goes with "sampling": true'),
                          ({"seed": 2, "sampling": False}, '"seed" goes with "sampling"'),
                          ({"sampling": 1}, '"sampling" must be true or false'),
                          ({"sampling": True, "topk": -1}, '"topk" must be >= 0, got -1'),
                          ({"sampling": True, "seed": -1}, '"seed" must be >= 0, got -1'),
                          ({"sampling": True, "topp": 0}, '"topp" must be in (0, 1]'),
                          ({"sampling": True, "seed": 1.5}, '"seed" must be an integer'),
                          ({"sampling": True, "nbest": 7}, '"nbest" must be between 1 and 6 samples'),
                          ({"sampling": True, "nbest": 0}, '"nbest" must be between 1 and 6'),
                          ({"sampling": True, "diverse_beam_groups": 2},
                           'does not go with "sampling"'),
                          ({"sampling": True, "constraints": ["w3"]},
                           "do not go with sampling")):
        status, err = request(server.url + "/translate",
                              json.dumps({"text": halves[0], **fields}).encode())
        assert status == 400 and words in err["error"], (fields, err)
        assert "\n" not in err["error"]


def test_batch_invariance_a_line_alone_and_among_concurrent_requests(server, ckpt, tmp_path):
    lines = [x for x in mixed_lines(24, seed=8) if x.strip()]
    want = generate(ckpt, tmp_path, lines)
    assert [translate(server.url, text=[x])[0] for x in lines[:4]] == want[:4]
    queued = server.stderr().count("sentences queued")
    # All at once: the batcher gathers lines of different requests (and of the big one)
    # into the same batches; the beam-2 requests go in batches of their own.
    with ThreadPoolExecutor(12) as pool:
        big = pool.submit(translate, server.url, text=lines)
        alone = [pool.submit(translate, server.url, text=[x]) for x in lines]
        other = [pool.submit(translate, server.url, text=[x], beam=2) for x in lines[:6]]
        assert big.result() == want
        assert [f.result() for f in alone] == [[w] for w in want]
        assert [f.result()[0] for f in other] == generate(ckpt, tmp_path, lines[:6], "--beam", 2)
    assert server.stderr().count("sentences queued") - queued == 1 + len(lines) + 6
    shared = [int(n) for n in re.findall(r"sentences from (\d+) requests", server.stderr())]
    assert max(shared) > 2, "no batch held the sentences of several requests"


def test_concurrent_clients_each_get_their_own_translations_in_order(server, ckpt, tmp_path):
    lines = mixed_lines(48, seed=11)
    want = generate(ckpt, tmp_path, lines)

    def client(k: int) -> list[list[str]]:
        mine = list(range(k, len(lines), 6))                # each client its own lines
        return [translate(server.url, text=[lines[i] for i in mine[j:j + 3]])
                for j in range(0, len(mine), 3)]

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(client, range(6)))
    for k, answers in enumerate(got):
        mine = list(range(k, len(lines), 6))
        assert answers == [[want[i] for i in mine[j:j + 3]] for j in range(0, len(mine), 3)]


def raw(url: str, method: str, path: str, body: bytes | None = None, chunked: bool = False):
    """One request through http.client (any method, a body with or without a length)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        if chunked:
            conn.request(method, path, body=iter([body[:100], body[100:]]), encode_chunked=True)
        else:
            conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


BAD = [  # (body, status, words the reason must contain)
    (b'{"text": ["w1"', 400, "not JSON"),
    (b'\xff{"text": []}', 400, "not UTF-8"),
    (b'["w1"]', 400, "JSON object"),
    (b'{"text": ["w1"], "lenpen": NaN}', 400, "NaN"),
    (b'{"text": ["w1"], "beem": 2}', 400, "unknown field \"beem\" (did you mean 'beam'?)"),
    (b'{"source": "w1"}', 400, "unknown field \"source\""),
    (b'{"beam": 2}', 400, "\"text\" is required"),
    (b'{"text": "w1 w2"}', 400, "list of strings, got a string"),
    (b'{"text": ["w1", 3]}', 400, "\"text\"[1] must be a string"),
    (b'{"text": ["w1"], "model": "other"}', 404, "unknown model \"other\""),
    (b'{"text": ["w1"], "model": 1}', 400, "\"model\" must be a string"),
    (b'{"text": ["w1"], "beam": 0}', 400, "beam must be >= 1"),
    (b'{"text": ["w1"], "beam": 7}', 400, "larger than this server allows (6"),
    (b'{"text": ["w1"], "beam": "4"}', 400, "\"beam\" must be an integer, got a string"),
    (b'{"text": ["w1"], "beam": true}', 400, "\"beam\" must be an integer"),
    (b'{"text": ["w1"], "lenpen": -1}', 400, "lenpen must be between 0 and 10"),
    (b'{"text": ["w1"], "lenpen": 400}', 400, "lenpen must be between 0 and 10"),
    (b'{"text": ["w1"], "unkpen": -1000}', 400, "unkpen must be >= -50"),
    (b'{"text": ["w1"], "max_len_a": 1e308}', 400, "more than 2048 output tokens"),
    (b'{"text": ["w1"], "max_len_b": 1' + b"0" * 400 + b'}', 400,
     "max_len_b between 0 and 2147483647"),
    (b'{"text": ' + b"[" * 1500 + b"]" * 1500 + b"}", 400, "nested too deeply"),
    (b'{"text": ["w1"], "model": "\\ud800"}', 400, "a lone surrogate (\\ud800)"),
    (b'{"text": ["w1 \\udfff w2"]}', 400, "a lone surrogate (\\udfff)"),
    (b'{"text": ["w1"], "max_len_b": 2.5}', 400, "\"max_len_b\" must be an integer"),
    (b'{"text": ["w1"], "max_len_b": 100000}', 400, "more than 2048 output tokens"),
    (b'{"text": ["w1"], "min_len": -1}', 400, "min_len must be >= 0"),
    (b'{"text": ["w1"], "diverse_beam_groups": 3}', 400,
     "diverse_beam_groups 3 must divide the beam size 4"),
    (b'{"text": ["w1"], "replace_unk": 1}', 400, "\"replace_unk\" must be true or false"),
    (b'{"text": ["w1"], "unkpen": "x"}', 400, "\"unkpen\" must be a number"),
    # a JSON integer too large for a float (a 500 "int too large to convert to float")
    (b'{"text": ["w1"], "unkpen": 1' + b"0" * 400 + b'}', 400, "\"unkpen\" is too large"),
    (b'{"text": ["w1"], "beam": 4, "diverse_beam_groups": 2, "diverse_beam_strength": -1'
     + b"0" * 400 + b'}', 400, "\"diverse_beam_strength\" is too large"),
    (b'{"text": ["w1", "w2"], "prefix": ["w3"]}', 400, "1 prefixes for 2 sentences"),
    (b'{"text": ["w1"], "prefix": [5]}', 400, "\"prefix\"[0] must be a string or null"),
    (b'{"text": ["w1"], "constraints": "w2"}', 400, "\"constraints\" must be a list"),
    (b'{"text": ["w1", "w2"], "constraints": [["w3"]]}', 400,
     "1 constraint lists for 2 sentences"),
    (b'{"text": ["w1"], "constraints": [["w3", 4]]}', 400,
     "\"constraints\"[0][1] must be a string, got a number"),
    (b'{"text": ["w1"], "constraints": ["w3", ""]}', 400, "\"constraints\"[1] is empty"),
    (b'{"text": ["w1", "w2"], "constraints": [null, ["w3 zebra"]]}', 400,
     "\"text\"[1]: constraint 1 ('w3 zebra') cannot be spelled"),
    (b'{"text": ["w1"], "constraints": ["w2", "w3"], "max_len_a": 0, "max_len_b": 1}', 400,
     "\"text\"[0]: its constraints need 2 target tokens, more than the 1"),
    (b'{"text": ["w1"], "constraints": ["w2"], "diverse_beam_groups": 2}', 400,
     "lexical constraints do not go with diverse beam groups"),
    (json.dumps({"text": ["w1"] * 61}).encode(), 413, "61 sentences in one request"),
    (json.dumps({"text": ["w1", " ".join(["w2"] * 31)]}).encode(), 413,
     "\"text\"[1] has 31 subwords"),
    (json.dumps({"text": ["w1 " * 1500]}).encode(), 413, "at most 4000 (--max-request-bytes)"),
]


@pytest.mark.parametrize("body,status,words", BAD, ids=[w for _, _, w in BAD])
def test_bad_requests_get_a_4xx_and_a_one_line_reason(server, body, status, words):
    got, answer = raw(server.url, "POST", "/translate", body)
    reason = json.loads(answer)["error"]
    assert (got, list(json.loads(answer))) == (status, ["error"]) and "\n" not in reason
    assert words in reason, reason


def test_size_limit_without_a_declared_length_wrong_method_and_path(server, ckpt, tmp_path):
    status, answer = raw(server.url, "POST", "/translate",
                         json.dumps({"text": ["w1 " * 1500]}).encode(), chunked=True)
    assert status == 413 and "passes 4000 bytes" in json.loads(answer)["error"]
    assert raw(server.url, "GET", "/translate") == (405, b'{"error":"GET is not allowed on '
                                                         b'/translate"}')
    status, answer = raw(server.url, "POST", "/nowhere", b"{}")
    assert status == 404 and "no such path /nowhere" in json.loads(answer)["error"]
    assert get(server.url + "/health") == (200, {"status": "ok"})
    assert get(server.url + "/ready") == (200, {"status": "ready", "models": ["tiny"]})
    # after all of that, the server still translates, as nmt-generate does
    assert translate(server.url, text=["w1 w2"]) == generate(ckpt, tmp_path, ["w1 w2"])


def test_a_405_names_the_allowed_method(server):
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", "/translate")
        r = conn.getresponse()
        r.read()
        assert r.status == 405 and r.getheader("allow") == "POST"
    finally:
        conn.close()


def test_two_models_by_name_and_stem(ckpt, tmp_path):
    other = make_checkpoint(tmp_path / "other.pt", seed=1)
    s = Server(tmp_path, ckpt, f"second={other}").wait_ready()
    try:
        lines = mixed_lines(12, seed=2)
        assert get(s.url + "/ready")[1]["models"] == ["tiny", "second"]
        assert translate(s.url, text=lines, model="tiny") == generate(ckpt, tmp_path, lines)
        want = generate(other, tmp_path, lines)
        assert translate(s.url, text=lines, model="second") == want
        assert want != generate(ckpt, tmp_path, lines)
        status, answer = request(s.url + "/translate", b'{"text": ["w1"]}')
        assert status == 400 and answer["error"] == ("\"model\" is required: this server has "
                                                     "tiny, second")
    finally:
        assert s.stop() == 0, s.stderr()


def test_sigterm_finishes_the_request_in_flight_then_exits_0(ckpt, tmp_path):
    # The batcher holds a lone request for up to 1.5 s: SIGTERM comes while it waits.
    s = Server(tmp_path, ckpt, "--max-wait-ms", 1500, verbose=True).wait_ready()
    lines = mixed_lines(10, seed=6)
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(translate, s.url, text=lines)
            s.wait_for("10 sentences queued")
            s.proc.send_signal(signal.SIGTERM)
            assert answer.result(timeout=60) == generate(ckpt, tmp_path, lines)
        assert s.proc.wait(60) == 0, s.stderr()
        assert "stopped" in s.stderr() and "Traceback" not in s.stderr()
        assert get(s.url + "/health") == (0, None)            # no longer listening
    finally:
        s.stop()


def test_bad_command_lines_are_one_line_errors(ckpt, tmp_path):
    from nmt.cli.serve import main as serve_main

    cases = [((), "no CHECKPOINT given"),
             ((tmp_path / "missing.pt",), "missing.pt: no such checkpoint file"),
             ((ckpt, ckpt), "two models named 'tiny'"),
             ((ckpt, f"a={ckpt}", f"a={ckpt}"), "two models named 'a'"),
             ((ckpt, "--max-batch-tokens", 0), "--max-batch-tokens must be >= 1"),
             ((ckpt, "--max-wait-ms", "nan"), "--max-wait-ms must be between 0 and 60000"),
             # inf overflowed the batcher's wait and killed its thread at the first request
             ((ckpt, "--max-wait-ms", "inf"), "--max-wait-ms must be between 0 and 60000"),
             ((ckpt, "--max-batch-search-tokens", 0), "--max-batch-search-tokens must be >= 1"),
             ((ckpt, "--max-queued-sentences", 0), "--max-queued-sentences must be >= 1"),
             ((ckpt, "--max-queued-sentences", 100), "must be at least "
                                                     "--max-sentences-per-request (512)"),
             ((ckpt, "--port", 70000), "--port must be between 0 and 65535"),
             ((ckpt, "--bogus"), "no such option --bogus")]
    for args, words in cases:
        r = CliRunner().invoke(serve_main, list(map(str, args)))
        assert r.exit_code == 2 and r.stdout == "", r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("nmt-serve: error: ")
        assert words in r.stderr, r.stderr


def run_cli(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt.cli.serve", *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_a_bad_checkpoint_or_a_port_in_use_stops_with_one_line(server, tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 not a checkpoint")
    port = server.url.rsplit(":", 1)[1]
    for args, words in [((corrupt, "--port", 0), "corrupt.pt: corrupt or truncated"),
                        ((corrupt, "--port", port), f"cannot listen on 127.0.0.1:{port} (")]:
        r = run_cli(*args)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and r.stdout == "", r.stderr
        assert last.startswith("nmt-serve: error: ") and words in last, r.stderr
        assert "Traceback" not in r.stderr


def test_batcher_never_mixes_sampling_with_beam_search_nor_two_seeds(ckpt):
    """A sampling request and a greedy one have equal SearchConfigs (beam 1, nbest 1): their
    sampling options alone keep them apart, as they keep two seeds apart."""
    from nmt.search.config import SamplingConfig, SearchConfig
    from nmt.search.translator import Translator
    from nmt.serve.batching import Batcher

    batches = []                            # per decoded batch: its sentences, its options

    class Recording(Translator):
        def translate_ids(self, ids, **kw):
            batches.append((len(ids), self.search, self.sampling))
            return super().translate_ids(ids, **kw)

    lines = [x for x in mixed_lines(12, seed=10) if x.strip()]
    greedy = SearchConfig(beam=1)
    seeds = [SamplingConfig(topk=5, seed=k) for k in (1, 2)]
    want = {None: Translator.from_checkpoint(ckpt, search=greedy).translate(lines)}
    for c in seeds:
        want[c] = Translator.from_checkpoint(ckpt, search=greedy, sampling=c).translate(lines)
    assert len({tuple(w) for w in want.values()}) == 3        # three different outputs
    translator = Translator.from_checkpoint(ckpt)
    translator.__class__ = Recording
    search = greedy.resolve(translator.search)
    batcher = Batcher(translator, "tiny", max_tokens=4000, max_wait=0.3).start()
    try:
        ids = translator.src_codec.encode_batch(lines)
        futures = {c: batcher.submit(search, ids, lines, sampling=c) for c in want}
        for c, f in futures.items():
            assert [r.text for r in f.result(60)] == want[c], c
    finally:
        batcher.stop()
    assert sorted((repr(s) for n, _, s in batches if n == len(lines))) == sorted(
        map(repr, want)), batches
    assert all(s == search for _, s, _ in batches) and len(batches) == 3


def test_batcher_respects_the_token_budget_and_never_mixes_options(ckpt):
    from nmt.search.config import BatchConfig, SearchConfig
    from nmt.search.translator import Translator
    from nmt.serve.batching import Batcher

    batches = []                            # per decoded batch: source widths, its options

    class Recording(Translator):            # the real Translator, its batches noted
        def translate_ids(self, ids, **kw):
            batches.append(([len(x) + 1 for x in ids], self.search))
            return super().translate_ids(ids, **kw)

    lines = [x for x in mixed_lines(30, seed=9) if x.strip()]
    translator = Translator.from_checkpoint(ckpt, batch=BatchConfig(max_tokens=40))
    want = translator.translate(lines)
    beam2 = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=2)).translate(lines[:5])
    translator.__class__ = Recording
    preset, two = translator.search, SearchConfig(beam=2).resolve(translator.search)
    batcher = Batcher(translator, "tiny", max_tokens=40, max_wait=0.3).start()
    try:
        encode = translator.src_codec.encode_batch
        alone = [batcher.submit(preset, encode([x]), [x]) for x in lines]
        other = batcher.submit(two, encode(lines[:5]), lines[:5])
        assert [f.result(60)[0].text for f in alone] == want
        assert [r.text for r in other.result(60)] == beam2
    finally:
        batcher.stop()
    assert sum(len(w) for w, s in batches if s == two) == 5
    assert sum(len(w) for w, s in batches if s == preset) == len(lines)
    assert all(len(w) == 1 or max(w) * len(w) <= 40 for w, _ in batches), batches
    assert max(len(w) for w, _ in batches) > 1       # sentences of several requests together


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_load_test_quick_mode_reports_every_level_against_offline(tmp_path):
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--quick",
                        "--limit", "24", "--threads", "1", "--clients", "1,4",
                        "--json", str(out)], capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads(out.read_text())
    assert report["offline_sentences_per_s"] > 0 and report["server_exit_code"] == 0
    assert [row["clients"] for row in report["levels"]] == [1, 4]
    for row in report["levels"]:
        assert row["sentences"] > 0 and row["mismatches"] == 0 and not row["failures"]
        assert row["sentences_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    assert "| 4 |" in r.stdout


def test_a_request_that_fails_does_not_fail_the_others_in_its_batch(ckpt):
    """Requests with equal options share batches; when a batch fails, each request in it is
    decoded again alone, so only the one that fails alone gets the error, and the failed
    request's sentences still waiting are not decoded."""
    from nmt.search.config import BatchConfig
    from nmt.search.translator import Translator
    from nmt.serve.batching import Batcher

    seen = []

    class Failing(Translator):              # fails any batch holding the sentence "w9 w9"
        def translate_ids(self, ids, sources=None, **kw):
            seen.append(list(sources))
            if "w9 w9" in sources:
                raise RuntimeError("this sentence cannot be decoded")
            return super().translate_ids(ids, sources=sources, **kw)

    translator = Translator.from_checkpoint(ckpt, batch=BatchConfig(max_tokens=1000))
    good = ["w1 w2", "w3", "w4 w5 w6"]
    want = translator.translate(good)
    translator.__class__ = Failing
    # widest source 3 subwords + eos: 10 sentences fill a batch of 40 tokens
    batcher = Batcher(translator, "tiny", max_tokens=40, max_wait=0.5).start()
    try:
        encode = translator.src_codec.encode_batch
        bad_lines = ["w9 w9"] + ["w7"] * 20
        ok = batcher.submit(translator.search, encode(good), good)
        bad = batcher.submit(translator.search, encode(bad_lines), bad_lines)
        assert [r.text for r in ok.result(60)] == want
        with pytest.raises(RuntimeError, match="cannot be decoded"):
            bad.result(60)
    finally:
        batcher.stop()
    # the shared batch, then each request alone; the 14 sentences of the failed request
    # that did not fit in the first batch are never decoded
    assert seen == [good + bad_lines[:7], good, bad_lines[:7]], seen


def test_a_response_with_text_utf8_cannot_hold_still_renders():
    """A lone surrogate that reached a response (echoed, or copied into a translation) is
    written as a JSON escape, not turned into a plain-text 500."""
    from nmt.serve.app import Json, error

    assert json.loads(Json({"translations": ["a \ud800 b"]}).body) == \
        {"translations": ["a \ud800 b"]}
    assert Json({"x": "Straße"}).body == '{"x":"Straße"}'.encode()       # UTF-8 when it can
    assert json.loads(error(404, "unknown model \udfff").body) == {"error": "unknown model \udfff"}


def test_a_checkpoint_whose_name_holds_an_equals_sign_is_a_checkpoint(ckpt, tmp_path,
                                                                      monkeypatch):
    from nmt.serve.models import ModelSpec, parse_specs

    (tmp_path / "lr=0.001.pt").write_bytes(ckpt.read_bytes())
    monkeypatch.chdir(tmp_path)             # "lr=0.001.pt" also reads as NAME=CHECKPOINT
    assert parse_specs(["lr=0.001.pt"]) == [ModelSpec("lr=0.001", "lr=0.001.pt")]
    assert parse_specs(["a=lr=0.001.pt"]) == [ModelSpec("a", "lr=0.001.pt")]


def test_a_prefix_longer_than_the_length_limit_is_refused_and_cut_in_the_search(server):
    """A prefix longer than its sentence's length limit is refused (400), as constraints that
    do not fit are; the search itself still cuts a prefix at the limit, so that its table
    (repeated for every beam row) stays as small as the search (a 300,000-token prefix for 8
    sentences at beam 16 took 660 MB before)."""
    import torch

    from nmt.search.prefix import PrefixConstraints

    long = " ".join(["w5", "w6"] * 50)
    status, answer = request(server.url + "/translate", json.dumps(
        {"text": ["w1 w2", "w3"], "prefix": long, "max_len_a": 0, "max_len_b": 4}).encode())
    assert status == 400 and answer["error"].startswith(
        "\"text\"[0]: its prefix needs 100 target tokens, more than the 4"), answer
    status, answer = request(server.url + "/translate", json.dumps(
        {"text": ["w1 w2"], "prefix": "w5 zebra"}).encode())
    assert status == 400 and "\"prefix\"[0]: prefix 'w5 zebra' cannot be spelled" in \
        answer["error"], answer
    state = PrefixConstraints([list(range(10000)), [1, 2]]).start(
        torch.ones(2, 3, dtype=torch.long), 16, torch.tensor([4, 1]))
    assert state.width == 4 and state.forced.shape == (32, 4)
    assert state.forced[16].tolist() == [1, -1, -1, -1]


def test_batches_are_bounded_in_search_steps(ckpt):
    """Sentences x beam x (longest length limit + 1) stays within max_search_tokens (a
    request's max_len_b and min_len would otherwise set the decoder cache's size), while a
    sentence above the bound alone is still decoded; the translations are nmt-generate's."""
    from nmt.search.config import BatchConfig, SearchConfig
    from nmt.search.translator import Translator
    from nmt.serve.batching import Batcher

    batches = []

    class Recording(Translator):
        def translate_ids(self, ids, **kw):
            batches.append([len(x) for x in ids])
            return super().translate_ids(ids, **kw)

    lines = [x for x in mixed_lines(24, seed=4) if x.strip()]
    search = SearchConfig(beam=2, max_len_a=1.0, max_len_b=6, min_len=3)
    translator = Translator.from_checkpoint(ckpt, search=search,
                                            batch=BatchConfig(max_tokens=1000))
    want = translator.translate(lines)
    translator.__class__ = Recording
    # the longest line: 13 subwords, a limit of 19, 20 steps, 40 at beam 2
    batcher = Batcher(translator, "tiny", max_tokens=1000, max_wait=0.3,
                      max_search_tokens=100).start()
    try:
        future = batcher.submit(translator.search, translator.src_codec.encode_batch(lines),
                                lines)
        assert [r.text for r in future.result(60)] == want
    finally:
        batcher.stop()
    assert sum(map(len, batches)) == len(lines)
    for widths in batches:
        assert len(widths) == 1 or len(widths) * 2 * (max(widths) + 6 + 1) <= 100, batches
    assert max(map(len, batches)) > 1


def test_a_full_queue_refuses_with_503_and_retry_after(ckpt, tmp_path):
    """A model's queue holds at most --max-queued-sentences: a request that would pass it gets
    503 with Retry-After at once; the requests already queued are answered."""
    s = Server(tmp_path, ckpt, "--max-wait-ms", 5000, "--max-sentences-per-request", 3,
               "--max-queued-sentences", 4, verbose=True).wait_ready()
    try:
        body = json.dumps({"text": ["w1 w2", "w3", "w4"]}).encode()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(raw, s.url, "POST", "/translate", body)
            s.wait_for(r"3 sentences queued")  # waiting up to 5 s for company
            conn = http.client.HTTPConnection(s.url.split("//")[1], timeout=60)
            conn.request("POST", "/translate", body=body)
            r = conn.getresponse()
            assert r.status == 503 and r.getheader("Retry-After") == "1"
            assert "--max-queued-sentences" in json.loads(r.read())["error"]
            conn.close()
            status, answer = first.result(60)
        assert status == 200 and len(json.loads(answer)["translations"]) == 3
    finally:
        assert s.stop() == 0, s.stderr()


def test_a_failed_decoding_thread_fails_every_request_and_readiness(ckpt):
    """Should the batcher's own thread fail (outside a batch), the requests waiting and every
    later one get the error instead of waiting forever."""
    from nmt.search.translator import Translator
    from nmt.serve.batching import Batcher, Stopping

    translator = Translator.from_checkpoint(ckpt)
    batcher = Batcher(translator, "tiny", max_tokens=40, max_wait=0.2)

    def broken(search):
        raise OverflowError("timestamp out of range")

    batcher._gather = broken
    ids = translator.src_codec.encode_batch(["w1 w2"])
    waiting = batcher.submit(translator.search, ids, ["w1 w2"])
    batcher.start()
    with pytest.raises(OverflowError, match="timestamp out of range"):
        waiting.result(60)
    assert isinstance(batcher.broken, OverflowError)
    with pytest.raises(Stopping, match="its decoding thread failed"):
        batcher.submit(translator.search, ids, ["w1 w2"])
    batcher.stop(10)

    # ... and /ready says so: 503 "failed", naming the model (the application itself, called
    # as the server calls it, on models whose batcher is this broken one)
    import asyncio
    import threading
    from types import SimpleNamespace

    from nmt.serve.app import create_app
    from nmt.serve.config import ServeConfig
    from nmt.serve.models import Models, ServedModel

    models = Models([], ServeConfig())
    models.specs = [SimpleNamespace(name="tiny", path=str(ckpt))]
    models.loaded["tiny"] = ServedModel("tiny", str(ckpt), translator, batcher, 30)
    models.ready = threading.Event()
    models.ready.set()
    sent = []

    async def call():
        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)
        scope = {"type": "http", "method": "GET", "path": "/ready", "headers": [],
                 "query_string": b"", "root_path": "", "scheme": "http",
                 "server": ("127.0.0.1", 80), "http_version": "1.1"}
        await create_app(models, ServeConfig())(scope, receive, send)

    asyncio.run(call())
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == {"status": "failed", "models": ["tiny"],
                                           "failed": ["tiny"]}


# --- hostile or careless clients: long requests, departures, stalls, shutdown ---------------

LONG = {"beam": 8, "max_len_b": 300, "min_len": 250}      # every hypothesis runs 250+ steps


def long_server(tmp_path, ckpt, *args) -> Server:
    """A server whose batches hold one LONG sentence each (and no wait for company)."""
    return Server(tmp_path, ckpt, "--max-batch-search-tokens", 3000, "--max-wait-ms", 0,
                  *args, verbose=True).wait_ready()


def long_lines() -> list[str]:
    return [x for x in mixed_lines(120, seed=8) if x.strip()][:100]


def send_long(s: Server):
    """100 LONG sentences sent on a socket of their own, once queued: (lines, socket)."""
    lines = long_lines()
    sock = send_raw(s.url, {"text": lines, **LONG})
    s.wait_for(r"100 sentences queued")
    return lines, sock


def send_raw(url: str, fields: dict):
    """POST /translate on a socket of its own, without reading the answer: the socket."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(fields).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def answered(sock) -> bytes:
    """What the server has sent on ``sock`` so far (b"" when nothing yet)."""
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


def read_answer(sock, timeout: float) -> tuple[int, dict]:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_requests_take_turns_and_a_departed_client_costs_nothing_more(ckpt, tmp_path):
    """A request of 100 long sentences (each decoded alone by the batch search budget) does
    not hold back a one-line request sent after it; when its client leaves, its sentences not
    yet decoded are dropped; a request over --max-request-search-tokens is refused at once."""
    s = long_server(tmp_path, ckpt, "--max-request-search-tokens", 300000)
    try:
        lines, long = send_long(s)
        start = time.monotonic()
        assert translate(s.url, text=["w1 w2"]) == generate(ckpt, tmp_path, ["w1 w2"])
        took = time.monotonic() - start
        assert answered(long) == b"", "the long request ended first"
        long.close()                                      # the client leaves
        s.wait_for(r"a client disconnected before its 100 sentences were translated")
        s.wait_for(r"\d+ sentences of cancelled requests dropped")
        # the model is free again at once: a short request takes as long as the first one did
        start = time.monotonic()
        assert translate(s.url, text=["w3 w4"]) == generate(ckpt, tmp_path, ["w3 w4"])
        assert time.monotonic() - start < max(5.0, 10 * took)
        status, answer = request(s.url + "/translate",
                                 json.dumps({"text": lines + lines, **LONG}).encode())
        assert status == 413 and "--max-request-search-tokens" in answer["error"], answer
    finally:
        assert s.stop() == 0, s.stderr()
    assert "Traceback" not in s.stderr()


def test_a_request_past_its_timeout_gets_503_and_its_work_is_dropped(ckpt, tmp_path):
    s = long_server(tmp_path, ckpt, "--request-timeout", 1)
    try:
        lines = long_lines()
        start = time.monotonic()
        status, answer = request(s.url + "/translate",
                                 json.dumps({"text": lines, **LONG}).encode())
        assert status == 503 and "--request-timeout" in answer["error"], answer
        assert 0.9 < time.monotonic() - start < 30
        s.wait_for(r"\d+ sentences of cancelled requests dropped")
        assert translate(s.url, text=["w1 w2"]) == generate(ckpt, tmp_path, ["w1 w2"])
    finally:
        assert s.stop() == 0, s.stderr()


def test_a_stalled_header_is_closed_and_connections_are_capped(ckpt, tmp_path):
    import socket

    s = Server(tmp_path, ckpt, "--header-timeout", 1, "--max-connections", 3).wait_ready()
    host, port = s.url.removeprefix("http://").split(":")
    try:
        stalled = socket.create_connection((host, int(port)), timeout=30)
        stalled.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")     # and nothing more
        start = time.monotonic()
        assert stalled.recv(1024) == b""                  # closed by the server
        assert 0.9 < time.monotonic() - start < 10
        stalled.close()
        # three open connections reach the cap: a fourth request gets 503 at once
        idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
        try:
            time.sleep(0.3)
            status, answer = raw(s.url, "POST", "/translate", b'{"text": ["w1"]}')
            assert status == 503, answer                  # uvicorn's own, plain text
        finally:
            for sock in idle:
                sock.close()
    finally:
        assert s.stop() == 0, s.stderr()


def test_shutdown_ends_within_its_grace(ckpt, tmp_path):
    """SIGTERM with a long request in flight: it gets 503 once --shutdown-grace is over and
    the server exits 0 soon after, without a traceback."""
    s = long_server(tmp_path, ckpt, "--shutdown-grace", 1)
    try:
        _, long = send_long(s)
        start = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        status, answer = read_answer(long, 30)
        assert status == 503 and "--shutdown-grace" in answer["error"], answer
        assert s.proc.wait(30) == 0, s.stderr()
        assert time.monotonic() - start < 1 + 2 + 5 + 5      # grace, uvicorn's, thread's, slack
        assert "Traceback" not in s.stderr()
    finally:
        s.stop()


def test_a_shortage_of_file_descriptors_is_logged_once(caplog):
    import asyncio
    import errno

    from nmt.serve.app import log_fd_shortage_once

    loop = asyncio.new_event_loop()
    try:
        log_fd_shortage_once(loop)
        with caplog.at_level(logging.WARNING, logger="nmt.serve"):
            for _ in range(5):
                loop.call_exception_handler({
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files")})
        said = [r for r in caplog.records if "Too many open files" in r.getMessage()]
        assert len(said) == 1 and "ulimit -n" in said[0].getMessage()
        assert not [r for r in caplog.records if r.exc_info]
    finally:
        loop.close()
