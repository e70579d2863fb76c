"""Decoding: beam search with an incremental decoder, and the Translator API.

- config.py          SearchConfig, BatchConfig, GenerateConfig (nmt-generate's options, written once)
- length_penalty.py  the GNMT length penalty and the bound used for early termination
- beam.py            the beam step policy (candidates in, choices out; deterministic ties)
- generator.py       the batched generation loop and its bookkeeping (``beam_search``)
- ensemble.py        one model or an ensemble behind one interface (average of probabilities)
- constraints.py     tree constraints: well-formed linearized trees by construction (parsing)
- translator.py      ``Translator``: raw text in, translations out, in input order; load_split
- forced.py          teacher-forced passes over given pairs: scores (score_pairs), alignments (align)
"""
