"""nmt and other toolkits, both ways: nmt's checkpoints exported for their engines
(``nmt-export``) and their models imported as ordinary, self-contained nmt checkpoints that
translate as the source toolkit does (``nmt-import``).

    ct2_export.py      nmt-export's entry point (export_model): a CTranslate2 model directory
                       with README.txt and translate.py; --format huggingface goes to
    hf_export.py       a Marian directory that transformers loads (MarianMTModel)
    hf_import.py       nmt-import huggingface: a Marian directory (OPUS-MT)
    marian.py          Marian <-> nmt: the parameter names and MarianConfig's keys, one table
                       that hf_export and hf_import both use
    hf_positions.py    position tables in a Marian directory, both ways
    fairseq.py         nmt-import fairseq: checkpoint, dictionaries, text pipeline
    fairseq_model.py   fairseq's arguments -> ModelConfig, its weights -> nmt's names
    safe_pickle.py     other toolkits' pickles read without running code from them
    foreign.py         safe reads, foreign vocabularies as nmt dictionaries, the output check,
                       and the one-line refusal naming every setting the other side lacks
"""
