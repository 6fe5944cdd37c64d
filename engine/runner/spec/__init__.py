"""Speculative decoding on the device: the rejection sampler that verifies drafts against
the target model, and the sampling of a draft model's proposals."""
