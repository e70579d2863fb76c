"""Decoding engines besides nmt's own PyTorch decoder (nmt.search.translator):
ctranslate2.py, CTranslate2 behind nmt's text pipeline (``--engine ctranslate2``)."""

ENGINES = ("nmt", "ctranslate2")     # the choices of --engine
