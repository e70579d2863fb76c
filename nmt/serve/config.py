"""nmt-serve's options: where it listens, how it batches, what a request may hold.

Each field is a command-line option (nmt.options.option), its default and help written once.
Importable without torch, starlette or uvicorn.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.errors import UsageError
from nmt.options import option


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
        10.0, "... or once the oldest waiting sentence has waited this long (milliseconds); "
              "sentences that arrive while a batch decodes join the next one without waiting.")
    # --- request limits (nmt.serve.requests) ---
    max_request_bytes: int = option(1 << 20, "Largest request body, in bytes (413 above).")
    max_sentences_per_request: int = option(512, "Most sentences in one request (413 above).")
    max_sentence_tokens: int = option(
        1024, "Longest sentence in subwords (413 above; also capped by what each model "
              "accepts): nmt-serve refuses what nmt-generate would truncate.")
    max_beam: int = option(16, "Largest \"beam\" a request may ask for (400 above).")
    max_output_tokens: int = option(
        2048, "Longest output a request's own \"max_len_a\" and \"max_len_b\" may allow for "
              "its longest sentence (400 above).")
    access_log: bool = option(False, "Log every request (method, path, status) to stderr.")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be between 0 and 65535, got {self.port}")
        for name in ("max_batch_tokens", "max_request_bytes", "max_sentences_per_request",
                     "max_sentence_tokens", "max_beam", "max_output_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if not self.max_wait_ms >= 0:          # also refuses nan
            raise UsageError(f"--max-wait-ms must be >= 0, got {self.max_wait_ms}")


__all__ = ["ServeConfig"]
