"""nmt-serve's options: where it listens, how it batches, what a request may hold.

Each field is a command-line option (nmt.fields.option), its default and help written once.
Importable without torch, starlette or uvicorn.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.engines import ENGINES
from nmt.errors import UsageError
from nmt.fields import option

MAX_WAIT_MS = 60_000          # a minute; a larger wait (inf) overflows the batcher's timeout
MAX_SECONDS = 86_400          # a day: the longest timeout or grace (inf overflows asyncio's)


@dataclass
class ServeConfig:
    host: str = option("127.0.0.1", "Address to listen on (0.0.0.0: every interface; nmt-serve "
                                    "has no authentication, keep it behind a proxy).")
    port: int = option(8080, "TCP port (0: any free port, logged at start).")
    # --- dynamic batching (nmt.serve.batching) ---
    max_batch_tokens: int = option(
        2048, "Decode together the waiting sentences (of requests with equal decoding options) "
              "up to this many source tokens, padding and eos included.")
    max_wait_ms: float = option(
        10.0, "... or once the oldest waiting sentence has waited this long (milliseconds, at "
              "most 60000); sentences that arrive while a batch decodes join the next one "
              "without waiting.")
    max_batch_search_tokens: int = option(
        65536, "... and at most this many search steps: sentences x beam x the longest length "
               "limit among them (+1, the eos). Bounds a batch's decoder cache and time whatever "
               "a request's beam, max_len and min_len; a sentence above it is decoded alone.")
    max_queued_sentences: int = option(
        16384, "Most sentences waiting to be decoded, per model; a request that would pass it "
               "is refused (503, Retry-After) instead of queued.")
    # --- request limits (nmt.serve.requests) ---
    max_request_bytes: int = option(1 << 20, "Largest request body, in bytes (413 above).")
    max_sentences_per_request: int = option(512, "Most sentences in one request (413 above).")
    max_sentence_tokens: int = option(
        1024, "Longest sentence in subwords (413 above; also capped by what each model "
              "accepts): nmt-serve refuses what nmt-generate would truncate.")
    max_beam: int = option(16, "Largest \"beam\" a request may ask for, and most samples "
                               "(\"nbest\") a sampling one may (400 above).")
    max_output_tokens: int = option(
        2048, "Longest output a request's own \"max_len_a\" and \"max_len_b\" may allow for "
              "its longest sentence (400 above).")
    max_request_search_tokens: int = option(
        1 << 20, "Most search steps one request may ask for: the sum over its sentences of "
                 "beam x (length limit + 1) (413 above): no single request may hold a model "
                 "for long.")
    # --- slow, stalled and departed clients (nmt.serve.app, nmt.serve.server) ---
    request_timeout: float = option(
        120.0, "Answer 503 to a request not translated within this many seconds, and drop "
               "its sentences not yet decoded (0: no limit). The sentences of a client that "
               "disconnects are dropped at once.", metavar="SECONDS")
    header_timeout: float = option(
        10.0, "Close a connection whose request line and headers have not all arrived within "
              "this many seconds (a stalled or very slow client).", metavar="SECONDS")
    max_connections: int = option(
        512, "Most open connections and requests at once; a request beyond them gets "
             "uvicorn's plain-text 503 at once (its limit_concurrency).")
    shutdown_grace: float = option(
        30.0, "On SIGTERM or Ctrl-C, let the requests in flight finish for at most this many "
              "seconds; what is left then gets 503 and the server exits.", metavar="SECONDS")
    access_log: bool = option(False, "Log every request (method, path, status) to stderr.")
    engine: str = option(
        "nmt", "What decodes: nmt (PyTorch) or ctranslate2 (pip install 'nmt[export]'; each "
               "checkpoint converted once and cached beside it, as nmt-generate --engine "
               "ctranslate2 does; a request asking for what it cannot decode as nmt does, "
               "such as a prefix or constraints, gets 400).", choices=ENGINES)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be between 0 and 65535, got {self.port}")
        for name in ("max_batch_tokens", "max_batch_search_tokens", "max_queued_sentences",
                     "max_request_bytes", "max_sentences_per_request", "max_sentence_tokens",
                     "max_beam", "max_output_tokens", "max_request_search_tokens",
                     "max_connections"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if self.max_queued_sentences < self.max_sentences_per_request:
            raise UsageError(f"--max-queued-sentences ({self.max_queued_sentences}) must be at "
                             f"least --max-sentences-per-request "
                             f"({self.max_sentences_per_request}), or a request within "
                             f"the limits could never be queued")
        for name in ("request_timeout", "header_timeout", "shutdown_grace"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_SECONDS or (name == "header_timeout" and value == 0):
                raise UsageError(f"--{name.replace('_', '-')} must be "
                                 f"{'> 0' if name == 'header_timeout' else '>= 0'} and at most "
                                 f"{MAX_SECONDS} seconds, got {value}")
        if not 0 <= self.max_wait_ms <= MAX_WAIT_MS:          # also refuses nan and inf
            raise UsageError(f"--max-wait-ms must be between 0 and {MAX_WAIT_MS}, got "
                             f"{self.max_wait_ms}")


__all__ = ["ServeConfig"]
