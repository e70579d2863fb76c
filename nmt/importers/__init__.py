"""Importers of models trained by other toolkits (``nmt-import``): each writes an ordinary,
self-contained nmt checkpoint that translates as the source toolkit does."""
