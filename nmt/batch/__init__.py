"""Translating files and streams at scale: the options of a batch run (GenerateConfig), input
read in chunks, output that resumes where a stopped run left off, worker processes and
torchrun shards. nmt-generate is a thin command over this package."""
