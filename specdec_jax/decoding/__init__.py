"""Decoding: the sampling distribution, the rejection rule, the scorers, the decoders."""
