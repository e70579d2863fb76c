"""nmt-generate: translate raw sentences with one checkpoint or an ensemble (beam search).

One output line per input line, in input order (an empty line gives an empty line). The real
work is nmt.search.translator.Translator; this module reads, writes and reports progress.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager
from typing import IO, Iterator, Sequence

import click

from nmt.cli.common import handle_errors, make_progress, read_path_from_stdin, setup_runtime
from nmt.errors import NmtError, UsageError

log = logging.getLogger("nmt.generate")

CHUNK_LINES = 10000      # stdin is translated in chunks of this many lines, so that it streams


def _chunks(lines: Iterator[str], n: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def format_result(result, output_format: str, nbest: int) -> str:
    """The output text of one input line: 1 line (text, jsonl) or ``nbest`` lines (text)."""
    if output_format == "jsonl":
        return json.dumps(result.to_json(), ensure_ascii=False)
    # A line break inside a translation (a byte-fallback subword could produce one) would
    # shift every following line: it becomes a space.
    texts = [_one_line(h.text) for h in result.hypotheses[:nbest]]
    texts += [""] * (nbest - len(texts))
    return "\n".join(texts)


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


@contextmanager
def open_output(path: str | None) -> Iterator[IO[bytes]]:
    """stdout (streamed), or a file written under a temporary name and renamed when complete,
    so that a crash never leaves a partial file that looks finished."""
    if path is None or path == "-":
        try:
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise
        except OSError as e:    # e.g. a full disk under a redirected stdout
            raise NmtError(f"<stdout>: cannot write ({e.strerror or e})") from None
        return
    from nmt.io import atomic_write
    with atomic_write(path, "wb") as f:
        yield f


class _Progress:
    """A rich bar on stderr (drawn only on a terminal) showing sentences/s."""

    def __init__(self, total: int | None, quiet: bool):
        self.done = 0
        self.start = time.perf_counter()
        self.bar = None if quiet else make_progress()
        self.task = None
        self.total = total

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("translating", total=self.total, rate="")
        return self

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            rate = self.done / max(time.perf_counter() - self.start, 1e-9)
            self.bar.update(self.task, advance=n, rate=f"{rate:.1f} sent/s")

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.argument("checkpoints", nargs=-1, type=click.Path())
@click.option("--input", "-i", "input_path", default=None, type=click.Path(),
              help="Source sentences, one per line, raw text (default: stdin; with no "
                   "CHECKPOINT: the --split of the checkpoint's data directory).")
@click.option("--output", "-o", "output_path", default=None, type=click.Path(),
              help="Write here instead of stdout (under a temporary name, renamed at the end).")
@click.option("--beam", "-b", type=int, default=None,
              help="Beam size [default: the checkpoint's preset, 4 for translation].")
@click.option("--lenpen", type=float, default=None,
              help="Length penalty alpha: scores are log P / ((5+|Y|)/6)^alpha "
                   "[default: the preset's, 0.6].")
@click.option("--max-len-a", type=float, default=None,
              help="Output length limit a*source_length + b, a [default: the preset's, 1].")
@click.option("--max-len-b", type=int, default=None,
              help="... and b [default: the preset's, 50].")
@click.option("--nbest", type=int, default=1, show_default=True,
              help="Hypotheses per sentence (<= beam). Text output: NBEST lines per input "
                   "line, best first, empty lines filling up; jsonl: an 'nbest' list.")
@click.option("--batch-size", type=int, default=None,
              help="Sentences per batch [default: 64 unless --max-tokens is given].")
@click.option("--max-tokens", type=int, default=None,
              help="Source tokens (padding included) per batch.")
@click.option("--max-source-len", type=int, default=1024, show_default=True,
              help="Longer sources (in subwords) are truncated with a warning naming the line "
                   "(also capped by the model's learned positions).")
@click.option("--split", default="test", show_default=True,
              help="Split of the data directory translated when no CHECKPOINT is given.")
@click.option("--device", default="auto", show_default=True,
              help="cpu, cuda, cuda:N or auto (a GPU when there is one).")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True,
              help="Model precision. fp16 needs a GPU; bf16 runs on a GPU or on a CPU with "
                   "native bf16 (AVX512-BF16/AMX: about 2x faster than fp32 there; it rounds "
                   "the model to bf16, so check BLEU). Softmax and scores stay fp32.")
@click.option("--threads", type=int, default=None,
              help="CPU threads for PyTorch (torch.set_num_threads).")
@click.option("--output-format", type=click.Choice(["text", "jsonl"]), default="text",
              show_default=True,
              help="text: detokenized translations; jsonl: one object per line with id, "
                   "source, translation, score, tokens and token_scores.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; warnings and errors only.")
@handle_errors("nmt-generate")
def main(checkpoints, input_path, output_path, beam, lenpen, max_len_a, max_len_b, nbest,
         batch_size, max_tokens, max_source_len, split, device, precision, threads,
         output_format, verbose, quiet):
    """Translate with CHECKPOINT (several: an ensemble averaging their probabilities).

    Reads raw sentences (--input or stdin), writes detokenized translations to stdout (or
    --output), one line per input line, in order. The subword model and vocabulary come from
    the checkpoint. Decoding is the paper's: beam 4, length penalty 0.6, at most
    source length + 50 tokens, unless the checkpoint's preset or the options say otherwise.

    With no CHECKPOINT, the first line of stdin is the checkpoint path (what nmt-train prints)
    and the --split of its data directory is translated:

    \b
      nmt-preprocess ... | nmt-train ... | nmt-generate | nmt-score --ref test.de
      nmt-generate ckpt/checkpoint_best.pt < test.en > test.hyp
      nmt-generate a.pt b.pt c.pt -i test.en --output-format jsonl > test.jsonl
    """
    setup_runtime(verbose, quiet, threads)
    if nbest < 1:
        raise UsageError("--nbest must be >= 1")

    from nmt.search.translator import Translator
    from nmt.training.checkpoint import load_checkpoint

    pipeline = not checkpoints
    if pipeline:
        if input_path == "-":
            raise UsageError("with no CHECKPOINT, stdin holds the checkpoint path; give the "
                             "sentences with --input FILE")
        sources: Sequence = [load_checkpoint(read_path_from_stdin("checkpoint"))]
    else:
        sources = list(checkpoints)
    translator = Translator.from_checkpoint(
        sources, device=device, beam=beam, lenpen=lenpen, max_len_a=max_len_a,
        max_len_b=max_len_b, nbest=nbest, batch_size=batch_size, max_tokens=max_tokens,
        max_source_len=max_source_len, precision=precision)
    s = translator.search
    log.info("beam %d, lenpen %g, max length %g * source + %d, %d model(s) on %s", s.beam,
             s.lenpen, s.max_len_a, s.max_len_b, len(translator.ensemble), translator.device)

    start = time.perf_counter()
    n_sent = n_tok = 0
    with open_output(output_path) as out:
        def emit(results) -> None:
            nonlocal n_sent, n_tok
            text = "".join(format_result(r, output_format, nbest) + "\n" for r in results)
            out.write(text.encode("utf-8"))
            out.flush()
            n_sent += len(results)
            n_tok += sum(len(r.hypotheses[0].ids) for r in results if r.hypotheses)

        if pipeline and input_path is None:
            ids, texts = _load_split(sources[0], split, translator, output_format)
            with _Progress(len(ids), quiet) as progress:
                emit(translator.translate_ids(ids, sources=texts, progress=progress))
        else:
            from nmt.io import iter_lines, read_lines
            if input_path is not None and input_path != "-":
                lines = read_lines(input_path)      # UTF-8 checked before any work
                chunks, total = _chunks(iter(lines), CHUNK_LINES), len(lines)
            else:
                # Typed at a terminal: translate each line as it comes; piped: in chunks.
                size = 1 if sys.stdin.isatty() else CHUNK_LINES
                chunks, total = _chunks(iter_lines(None), size), None
            with _Progress(total, quiet) as progress:
                first = 1
                for chunk in chunks:
                    emit(translator.translate_results(chunk, progress=progress,
                                                      first_line=first))
                    first += len(chunk)
    elapsed = time.perf_counter() - start
    log.info("translated %d sentences (%d target tokens) in %.1f s: %.1f sentences/s, "
             "%.0f tokens/s", n_sent, n_tok, elapsed, n_sent / max(elapsed, 1e-9),
             n_tok / max(elapsed, 1e-9))


def _load_split(ckpt: dict, split: str, translator, output_format: str):
    """Source ids of ``split`` in the data directory the checkpoint was trained on."""
    from nmt.data.datadir import DataDir

    data_dir = ckpt.get("data_dir")
    if not data_dir:
        raise NmtError("the checkpoint records no data directory; give the sentences to "
                       "translate with --input FILE")
    dd = DataDir.open(data_dir)
    if not dd.src_codec.same_as(translator.src_codec):
        raise NmtError(f"{data_dir}: its source vocabulary differs from the checkpoint's; "
                       f"give the sentences with --input FILE")
    ds = dd.load_split(split)
    ids = [ds.src(i) for i in range(len(ds))]
    texts = [dd.src_codec.decode(x) for x in ids] if output_format == "jsonl" else [""] * len(ids)
    log.info("translating split '%s' of %s (%d sentences)", split, data_dir, len(ids))
    return ids, texts


if __name__ == "__main__":
    main()
