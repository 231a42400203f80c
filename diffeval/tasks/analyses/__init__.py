"""The analyses family: tasks that measure where a model's attention goes on another family's samples (attention on
needle's, distractor-attention on mk-niah's and vt's), generating nothing.

They share one machinery (`shares`): the key segments a prompt is cut into (answer, needles, noise, scaffold, sink),
the per-map shares of each segment (a DIFF model's map 1, map 2 and differential map, a baseline's softmax map), the
segment table, the up-front check that every model's attention can be captured, and the view of a sample's shares.
"""
