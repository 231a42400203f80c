"""Toy DIFF / baseline pair: corpus generator, deterministic CPU training, in-training needle check."""
