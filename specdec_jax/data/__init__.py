"""Data layer: Debian-package corpora, SentencePiece vocabulary, seqio Tasks, n-gram stats.

The only layer allowed to import TensorFlow/seqio; `layout`, `corpora`, `prompts` and
`ngram_stats` do not.
"""
